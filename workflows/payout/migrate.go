package payout

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSetName names the payout's tables' migrations, with their own version
// table (payout_schema_version), apart from the engine's.
const migrationSetName = "payout"

// Migrate creates or updates the payout's tables (payout_wallet and payout) in
// pool's database. Call it at start, beside engine.Migrate; it is safe to call
// from several processes at once, and does nothing when the tables are up to
// date (see internal/migrate).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrate.Apply(ctx, pool, migrationSetName, migrations, "migrations", nil); err != nil {
		return fmt.Errorf("payout: %w", err)
	}
	return nil
}
