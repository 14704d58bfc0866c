package fakeprovider

import (
	"context"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet names the provider's migrations (version table
// provider_schema_version), apart from the engine's and the demo's.
const migrationSet = "provider"

// Migrate creates or updates the provider's schema in pool's database. It is safe to call from several processes at once (see
// store.ApplyMigrations).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("provider: migrations: %w", err)
	}
	if err := store.ApplyMigrations(ctx, pool, sub, migrationSet, nil); err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}
