package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

//go:embed migrations/*.sql
var migrations embed.FS

// gooseTable is goose's version table for idemflow's own migrations, named apart so
// that an application that uses goose too keeps its own history.
const gooseTable = "idemflow_goose_version"

// riverMigrateLock is the advisory lock key that serialises River's migrations when
// several processes start at once (River's migrator takes no lock of its own).
const riverMigrateLock = 0x69_64_65_6d_66_6c_77 // "idemflw"

// Migrations returns idemflow's schema migrations, in goose's SQL format. sqlc reads
// the same files as its schema.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the embedded directory is fixed at build time
	}
	return sub
}

// MigrateOpts are options for Migrate.
type MigrateOpts struct {
	// Logger receives a line per applied migration. Defaults to slog.Default().
	Logger *slog.Logger
}

// Migrate applies idemflow's migrations and River's to the database, up to the latest
// version. It is safe to call from several processes at once: goose holds a session
// lock and River's migrations run under a session-level advisory lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}

	if err := ApplyMigrations(ctx, pool, Migrations(), gooseTable, logger); err != nil {
		return fmt.Errorf("store: %w", err)
	}

	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return fmt.Errorf("store: river migrator: %w", err)
	}
	// River's migrations cannot share one transaction (a later one uses an enum
	// value that an earlier one adds), so a session lock on a connection of its
	// own serialises them across processes instead.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("store: river migration lock: %w", err)
	}
	defer conn.Release()
	q := dbsqlc.New()
	if err := q.AdvisoryLock(ctx, conn, riverMigrateLock); err != nil {
		return fmt.Errorf("store: river migration lock: %w", err)
	}
	defer func() { _ = q.AdvisoryUnlock(context.WithoutCancel(ctx), conn, riverMigrateLock) }()
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("store: apply river migrations: %w", err)
	}
	for _, v := range res.Versions {
		logger.InfoContext(ctx, "applied river migration", slog.Int("version", v.Version))
	}
	return nil
}

// ErrNotMigrated is matched by the error of CheckSchema for a database that lacks
// idemflow's or River's latest migrations.
var ErrNotMigrated = errors.New("store: the database is not migrated")

// CheckSchema returns an error matching ErrNotMigrated, saying what is missing,
// when the database lacks migrations of idemflow's or River's that this build
// has. It takes no lock and writes nothing.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, db, Migrations(),
		goose.WithTableName(gooseTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("store: migrations: %w", err)
	}
	current, target, err := provider.GetVersions(ctx)
	if err != nil {
		return fmt.Errorf("%w: idemflow's schema version cannot be read (%w)", ErrNotMigrated, err)
	}
	if current < target {
		return fmt.Errorf("%w: idemflow's schema is at version %d, this build needs %d", ErrNotMigrated, current, target)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("store: river migrator: %w", err)
	}
	res, err := migrator.Validate(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: River's schema cannot be read (%w)", ErrNotMigrated, err)
	}
	if !res.OK {
		return fmt.Errorf("%w: River's: %s", ErrNotMigrated, strings.Join(res.Messages, "; "))
	}
	return nil
}

// ApplyMigrations applies the goose SQL migrations in fsys (files at its root) to
// pool's database, recording them in the version table named table, which must be
// the set's own so that each set keeps its own history. It is safe to call from
// several processes at once: goose holds a session-level advisory lock (polled
// every second, for up to five minutes) while it migrates. Each applied migration
// is logged to logger, or to slog.Default() when it is nil. The demo's ledger, the
// fake provider and the benchmark apply their own migrations with it.
func ApplyMigrations(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, table string, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithTableName(table),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrations of %s: %w", table, err)
	}
	results, err := provider.Up(ctx)
	if err != nil {
		return fmt.Errorf("apply migrations of %s: %w", table, err)
	}
	for _, r := range results {
		logger.InfoContext(ctx, "applied migration", slog.String("migration", r.Source.Path),
			slog.String("table", table), slog.Duration("took", r.Duration))
	}
	return nil
}
