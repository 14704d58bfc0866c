package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet names idemflow's own migrations: their version table is
// idemflow_schema_version, apart from any of the application's.
const migrationSet = "idemflow"

// riverMigrateLock is the advisory lock key that serialises River's migrations when
// several processes start at once (River's migrator takes no lock of its own).
const riverMigrateLock = 0x69_64_65_6d_66_6c_77 // "idemflw"

// Migrations returns idemflow's schema migrations, in tern's SQL format (a file per
// version, the statements that undo it below a "---- create above / drop below
// ----" line). sqlc reads the same files as its schema.
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
// version. It is safe to call from several processes at once: each set runs under a
// session-level advisory lock (see MigrationSet.Apply), and so do River's. It runs on
// connections of its own, without pool's statement and lock timeouts, which are
// meant for a run's statements: a migration, and the wait for another process's,
// may take longer.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	pool, err := unbounded(ctx, pool)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer pool.Close()

	if err := (MigrationSet{Name: migrationSet, FS: Migrations()}).Apply(ctx, pool, logger); err != nil {
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
// has. It takes no lock and writes nothing. It reads on a connection of its
// own without pool's statement and lock timeouts, as migrations run: another
// process that is migrating at the same moment holds locks on the version
// tables, and the check waits for it (ctx bounds the wait) rather than fail.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool) error {
	files, err := migrate.FindMigrations(Migrations())
	if err != nil {
		return fmt.Errorf("store: migrations: %w", err)
	}
	pool, err = unbounded(ctx, pool)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer pool.Close()
	// Read as it is: tern's NewMigrator would create the table.
	var current int32
	if err := pool.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{versionTable(migrationSet)}.Sanitize()).Scan(&current); err != nil {
		return fmt.Errorf("%w: idemflow's schema version cannot be read (%w)", ErrNotMigrated, err)
	}
	if target := int32(len(files)); current < target {
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

// schemaMigrateLock is the advisory lock key that serialises MigrationSet.Apply
// across processes, around tern's own lock: adopting a set's goose history must
// happen once.
const schemaMigrateLock = 0x69_64_65_6d_73_63_68 // "idemsch"

// versionTable is the version table of a set of migrations.
func versionTable(set string) string { return set + "_schema_version" }

// unbounded opens a small pool on pool's database without the statement, lock
// and idle-transaction timeouts of pool's connections, for migrations.
func unbounded(ctx context.Context, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	c := pool.Config().Copy()
	for _, p := range []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"} {
		delete(c.ConnConfig.RuntimeParams, p)
	}
	c.MaxConns, c.MinConns = 2, 0
	p, err := pgxpool.NewWithConfig(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("migration pool: %w", err)
	}
	return p, nil
}

// MigrationSet is a named set of SQL migrations with a version table of its own,
// <Name>_schema_version, so that the sets in one database (idemflow's, a
// service's) keep their own histories. The demo's ledger, the fake provider and
// the benchmark each declare one.
type MigrationSet struct {
	// Name names the set and its version table.
	Name string
	// FS holds the migrations in its directory Dir (its root when Dir is
	// empty), in tern's format: files named <version>_<name>.sql, numbered
	// from 1.
	FS  fs.FS
	Dir string
}

// Apply applies the set's migrations to pool's database, up to the latest. A
// database whose set was migrated by goose, as this package did before
// (<Name>_goose_version), continues from the version goose recorded. It is safe
// to call from several processes at once: it runs under a session-level advisory
// lock, on a connection of its own without pool's statement and lock timeouts.
// Each applied migration is logged to logger, or to slog.Default() when it is
// nil.
func (ms MigrationSet) Apply(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	set, fsys := ms.Name, ms.FS
	if fsys == nil {
		return fmt.Errorf("migrations of %s: no FS", set)
	}
	if ms.Dir != "" && ms.Dir != "." {
		sub, err := fs.Sub(fsys, ms.Dir)
		if err != nil {
			return fmt.Errorf("migrations of %s: %w", set, err)
		}
		fsys = sub
	}
	if logger == nil {
		logger = slog.Default()
	}
	pool, err := unbounded(ctx, pool)
	if err != nil {
		return fmt.Errorf("migrations of %s: %w", set, err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrations of %s: %w", set, err)
	}
	defer conn.Release()
	q := dbsqlc.New()
	if err := q.AdvisoryLock(ctx, conn, schemaMigrateLock); err != nil {
		return fmt.Errorf("migrations of %s: lock: %w", set, err)
	}
	defer func() { _ = q.AdvisoryUnlock(context.WithoutCancel(ctx), conn, schemaMigrateLock) }()

	table := versionTable(set)
	if err := adoptGoose(ctx, conn.Conn(), table, set+"_goose_version"); err != nil {
		return fmt.Errorf("migrations of %s: %w", set, err)
	}
	m, err := migrate.NewMigrator(ctx, conn.Conn(), table)
	if err == nil {
		err = m.LoadMigrations(fsys)
	}
	if err != nil {
		return fmt.Errorf("migrations of %s: %w", set, err)
	}
	m.OnStart = func(version int32, name, direction, _ string) {
		logger.InfoContext(ctx, "applying migration", slog.String("migration", name),
			slog.String("set", set), slog.Int("version", int(version)), slog.String("direction", direction))
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("apply migrations of %s: %w", set, err)
	}
	return nil
}

// adoptGoose gives a set that goose migrated (its version table gooseTable)
// tern's version table at the version goose last applied, once: while tern's
// table is missing or still at version 0.
func adoptGoose(ctx context.Context, conn *pgx.Conn, ternTable, gooseTable string) error {
	var ternExists, gooseExists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL",
		ternTable, gooseTable).Scan(&ternExists, &gooseExists); err != nil {
		return fmt.Errorf("look for version tables: %w", err)
	}
	if !gooseExists {
		return nil
	}
	tern := pgx.Identifier{ternTable}.Sanitize()
	if ternExists {
		var current int32
		if err := conn.QueryRow(ctx, "SELECT version FROM "+tern).Scan(&current); err != nil {
			return fmt.Errorf("read tern's version: %w", err)
		}
		if current > 0 {
			return nil
		}
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var version int32
		goose := pgx.Identifier{gooseTable}.Sanitize()
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version_id), 0)::int4 FROM "+goose+" WHERE is_applied").Scan(&version); err != nil {
			return fmt.Errorf("read goose's version: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+tern+" (version int4 NOT NULL)"); err != nil {
			return fmt.Errorf("adopt goose's version: %w", err)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM "+tern); err != nil {
			return fmt.Errorf("adopt goose's version: %w", err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+tern+" (version) VALUES ($1)", version); err != nil {
			return fmt.Errorf("adopt goose's version: %w", err)
		}
		return nil
	})
}
