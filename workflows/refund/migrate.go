package refund

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet is the demo's business tables' migrations (version table
// demo_schema_version), apart from the engine's and the provider's.
var migrationSet = store.MigrationSet{Name: "demo", FS: migrations, Dir: "migrations"}

// Migrate creates or updates the tables of orders, refunds and the ledger in
// pool's database. It is safe to call from several processes at once (see
// store.MigrationSet.Apply).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrationSet.Apply(ctx, pool, nil); err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	return nil
}
