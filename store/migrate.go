package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet names idemflow's own migrations: their version table is
// idemflow_schema_version, apart from any of the application's.
const migrationSet = "idemflow"

// Migrations returns idemflow's schema migrations, in tern's SQL format (a file per
// version, the statements that undo it below a "---- create above / drop below
// ----" line), which MigrationSet runs. sqlc reads the same files as its schema.
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

// Migrate applies idemflow's migrations to the database, up to the latest
// version (River's are the engine's to apply). It needs no session of its
// own: every migration runs in a transaction that first takes a
// transaction-scoped advisory lock and lifts pool's statement, lock and
// idle-in-transaction timeouts (meant for a run's statements: a migration,
// and the wait for another process's, may take longer). So it is safe to
// call from several processes at once, and through a pooler in transaction
// mode.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts *MigrateOpts) error {
	if opts == nil {
		opts = &MigrateOpts{}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if err := (MigrationSet{Name: migrationSet, FS: Migrations()}).Apply(ctx, pool, logger); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// LiftTimeouts lifts the statement, lock and idle-in-transaction timeouts
// for the rest of db's transaction: for a migration, and the wait for
// another process's.
func (s *Store) LiftTimeouts(ctx context.Context, db DBTX) error {
	if err := s.q.SetLocalUnbounded(ctx, db); err != nil {
		return fmt.Errorf("store: lift timeouts: %w", err)
	}
	return nil
}

// AdvisoryXactLock waits for, then holds until db's transaction ends, the
// advisory lock key.
func (s *Store) AdvisoryXactLock(ctx context.Context, db DBTX, key int64) error {
	if err := s.q.AdvisoryXactLock(ctx, db, key); err != nil {
		return fmt.Errorf("store: advisory lock: %w", err)
	}
	return nil
}

// ErrNotMigrated is matched by the error of CheckSchema for a database that lacks
// idemflow's latest migrations.
var ErrNotMigrated = errors.New("store: the database is not migrated")

// CheckSchema returns an error matching ErrNotMigrated, saying what is missing,
// when the database lacks migrations of idemflow's that this build has; with
// check, it runs check (River's, the engine's) in the same transaction. It takes no lock and writes nothing. It reads in a read-only transaction
// without pool's statement and lock timeouts, as migrations run: another
// process that is migrating at the same moment holds locks on the version
// tables, and the check waits for it (ctx bounds the wait) rather than fail.
func CheckSchema(ctx context.Context, pool *pgxpool.Pool, check func(ctx context.Context, tx pgx.Tx) error) error {
	ms, err := buildMigrations()
	if err != nil {
		return fmt.Errorf("store: migrations: %w", err)
	}
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := dbsqlc.New().SetLocalUnbounded(ctx, tx); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		current, err := readSchemaVersion(ctx, tx)
		if err != nil {
			return err
		}
		if target := int32(len(ms)); current < target {
			return fmt.Errorf("%w: idemflow's schema is at version %d, this build needs %d", ErrNotMigrated, current, target)
		}
		if check != nil {
			if err := check(ctx, tx); err != nil {
				return fmt.Errorf("%w: %w", ErrNotMigrated, err)
			}
		}
		return nil
	})
}

// schemaMigrateLock is the advisory lock key that serialises the migrations of
// every MigrationSet across processes. Processes of builds that ran tern held
// it for a session around all of a set's; the transaction-scoped lock taken
// now waits for theirs, and theirs for it.
const schemaMigrateLock = 0x69_64_65_6d_73_63_68 // "idemsch"

// MigrationSet is a named set of SQL migrations with a version table of its own,
// <Name>_schema_version, so that the sets in one database (idemflow's, a
// service's) keep their own histories. The demo's ledger, the fake provider and
// the benchmark each declare one.
type MigrationSet struct {
	// Name names the set and its version table.
	Name string
	// FS holds the migrations in its directory Dir (its root when Dir is
	// empty), in tern's SQL format: files named <version>_<name>.sql,
	// numbered from 1, the SQL that undoes each below a "---- create above /
	// drop below ----" line. Each runs in a transaction of its own: tern's
	// "---- tern: disable-tx ----" (for CREATE INDEX CONCURRENTLY, say) and
	// its Go templates are refused.
	FS  fs.FS
	Dir string
}

// Apply applies the set's migrations to pool's database, up to the latest; a
// database that a newer build migrated further is left as it is. A database
// whose set was migrated by goose, as this package did before
// (<Name>_goose_version), continues from the version goose recorded. Each
// migration runs in a transaction of its own that first takes a
// transaction-scoped advisory lock, shared by every set, and reads the
// version again under it, so it is safe to call from several processes at
// once and through a pooler in transaction mode; the transaction lifts pool's
// statement, lock and idle-in-transaction timeouts. Each applied migration is
// logged to logger, or to slog.Default() when it is nil.
func (ms MigrationSet) Apply(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	migrations, err := ms.load()
	if err != nil {
		return err
	}
	return ms.migrate(ctx, pool, migrations, int32(len(migrations)), true, logger)
}

// MigrateTo moves the set's schema to version, up by the migrations' SQL or
// down by the SQL that undoes them (an error for one that has none), as Apply
// does; 0 undoes them all.
func (ms MigrationSet) MigrateTo(ctx context.Context, pool *pgxpool.Pool, version int, logger *slog.Logger) error {
	migrations, err := ms.load()
	if err != nil {
		return err
	}
	if version < 0 || version > len(migrations) {
		return fmt.Errorf("migrations of %s: version %d is not one of 0 to %d", ms.Name, version, len(migrations))
	}
	return ms.migrate(ctx, pool, migrations, int32(version), false, logger)
}

// load reads the set's migrations.
func (ms MigrationSet) load() ([]migration, error) {
	fsys := ms.FS
	if fsys == nil {
		return nil, fmt.Errorf("migrations of %s: no FS", ms.Name)
	}
	if ms.Dir != "" && ms.Dir != "." {
		sub, err := fs.Sub(fsys, ms.Dir)
		if err != nil {
			return nil, fmt.Errorf("migrations of %s: %w", ms.Name, err)
		}
		fsys = sub
	}
	migrations, err := loadMigrations(fsys)
	if err != nil {
		return nil, fmt.Errorf("migrations of %s: %w", ms.Name, err)
	}
	return migrations, nil
}

func (ms MigrationSet) migrate(ctx context.Context, pool *pgxpool.Pool, migrations []migration, target int32, up bool, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	if err := migrateSet(ctx, pool, ms.Name, migrations, target, up, logger); err != nil {
		return fmt.Errorf("apply migrations of %s: %w", ms.Name, err)
	}
	return nil
}
