package engine

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

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
// them). It is safe to call from several processes at once, and does nothing
// when the database is up to date. opts may be nil.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	return store.Migrate(ctx, pool, &store.MigrateOpts{Logger: opts.Logger})
}
