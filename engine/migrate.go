package engine

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/riverschema"
	"github.com/idemflow/idemflow/store"
)

// MigrateOpts are the optional parts of Migrate.
type MigrateOpts struct {
	// Logger receives a line per applied migration. Defaults to slog.Default().
	Logger *slog.Logger
}

// Migrate applies the engine's migrations, idemflow's and River's, to pool's
// database, up to the latest this build has: the one call a service makes at
// start, before New and StartWorkers (which refuses a database that lacks
// them). It does nothing when the database is up to date. Each migration runs
// in a transaction of its own under a transaction-scoped advisory lock, and
// without pool's statement and lock timeouts: it is safe to call from several
// processes at once, and through a pooler in transaction mode (Config.Pooler).
// opts may be nil.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	if err := store.Migrate(ctx, pool, &store.MigrateOpts{Logger: opts.Logger}); err != nil {
		return err
	}
	if err := riverschema.Migrate(ctx, pool, opts.Logger); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// checkSchema returns an error matching ErrNotMigrated when pool's database
// lacks idemflow's or River's migrations that this build has.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	return store.CheckSchema(ctx, pool, riverschema.Check)
}
