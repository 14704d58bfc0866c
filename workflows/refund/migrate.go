package refund

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

// migrationSet names the demo's business tables' migrations (version table
// demo_schema_version), apart from the engine's and the provider's.
const migrationSet = "demo"

// Migrate creates or updates the tables of orders, refunds and the ledger in
// pool's database. It is safe to call from several processes at once (see
// store.ApplyMigrations).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("refund: migrations: %w", err)
	}
	if err := store.ApplyMigrations(ctx, pool, sub, migrationSet, nil); err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	return nil
}
