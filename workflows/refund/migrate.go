package refund

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSetName names the demo's business tables' migrations (version table
// demo_schema_version), apart from the engine's and the provider's.
const migrationSetName = "demo"

// Migrate creates or updates the tables of orders, refunds and the ledger in
// pool's database. It is safe to call from several processes at once (see
// internal/migrate).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrate.Apply(ctx, pool, migrationSetName, migrations, "migrations", nil); err != nil {
		return fmt.Errorf("refund: %w", err)
	}
	return nil
}
