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

// gooseTable is goose's version table for the provider's migrations, named apart
// from the engine's and the demo's so that each keeps its own history.
const gooseTable = "provider_goose_version"

// Migrate creates or updates the provider's schema in pool's database. It is safe to call from several processes at once (see
// store.ApplyMigrations).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("provider: migrations: %w", err)
	}
	if err := store.ApplyMigrations(ctx, pool, sub, gooseTable, nil); err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}
