package engine

import (
	"context"
	"fmt"
	"io/fs"
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

// MigrateSet applies a set of the service's own migrations, for its own
// tables: the files of fsys's directory dir (its root when empty), named
// <version>_<name>.sql and numbered from 1, in tern's SQL format (what undoes
// a migration below a "---- create above / drop below ----" line; tern's
// templates and disable-tx are refused), with a version table of their own
// (<name>_schema_version, as tern kept it: a database that tern migrated goes
// on from its version), so that they keep their history beside idemflow's.
// Like Migrate, it runs each migration in a transaction of its own, is safe
// to call from several processes at once, and runs through a pooler in
// transaction mode. opts may be nil.
func MigrateSet(ctx context.Context, pool *pgxpool.Pool, name string, fsys fs.FS, dir string, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	return store.MigrationSet{Name: name, FS: fsys, Dir: dir}.Apply(ctx, pool, opts.Logger)
}
