package fakeprovider

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSetName names the provider's migrations (version table
// provider_schema_version), apart from the engine's and the demo's.
const migrationSetName = "provider"

// Migrate creates or updates the provider's schema in pool's database. It is
// safe to call from several processes at once (see internal/migrate).
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrate.Apply(ctx, pool, migrationSetName, migrations, "migrations", nil); err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	return nil
}
