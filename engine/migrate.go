package engine

import (
	"context"
	"io/fs"
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

// MigrateSet applies a set of the service's own migrations, for its own
// tables: the files of fsys's directory dir (its root when empty), named
// <version>_<name>.sql in tern's format, with a version table of their own
// (<name>_schema_version), so that they keep their history beside
// idemflow's. Like Migrate, it is safe to call from several processes at
// once. opts may be nil.
func MigrateSet(ctx context.Context, pool *pgxpool.Pool, name string, fsys fs.FS, dir string, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	return store.MigrationSet{Name: name, FS: fsys, Dir: dir}.Apply(ctx, pool, opts.Logger)
}
