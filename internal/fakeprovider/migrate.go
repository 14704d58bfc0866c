package fakeprovider

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet is the provider's migrations (version table
// provider_schema_version), apart from the engine's and the demo's.
var migrationSet = store.MigrationSet{Name: "provider", FS: migrations, Dir: "migrations"}

// Migrate creates or updates the provider's schema in pool's database. It is
// safe to call from several processes at once (see store.MigrationSet.Apply).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrationSet.Apply(ctx, pool, nil); err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}
