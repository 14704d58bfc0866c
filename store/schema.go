package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// What a process of this build can tell of a database whose schema another
// build migrated: the version there against its own, and whether its own
// statements still fit that schema. A migration is rolling when they do (it
// adds a table, a column with a default, a function); one that is not makes
// the statements of the builds before it fail (00015 renames a column that
// they name), so that an old process left running refuses to work rather than
// work wrongly.

// buildMigrations are idemflow's migrations in this build, read once.
var buildMigrations = sync.OnceValues(func() ([]migration, error) { return loadMigrations(Migrations()) })

// SchemaVersions returns the version of idemflow's schema in db's database (the
// last of idemflow's migrations applied there) and the latest that this build
// has. The database is ahead of the build (database > build) once a newer
// build migrated it. It reads one row; an error matching ErrNotMigrated when
// the database has no version of idemflow's schema.
func SchemaVersions(ctx context.Context, db DBTX) (database, build int, err error) {
	ms, err := buildMigrations()
	if err != nil {
		return 0, 0, fmt.Errorf("store: migrations: %w", err)
	}
	v, err := readSchemaVersion(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	return int(v), len(ms), nil
}

// readSchemaVersion reads the version of idemflow's schema, with an error
// matching ErrNotMigrated when it has none. The version table is the
// migration runner's, not a migration's, so sqlc does not know it: the
// statement is written here, as MigrationSet's are.
func readSchemaVersion(ctx context.Context, db DBTX) (int32, error) {
	var v int32
	err := db.QueryRow(ctx, "SELECT version FROM "+pgx.Identifier{versionTable(migrationSet)}.Sanitize()).Scan(&v)
	switch {
	case err == nil:
		return v, nil
	case IsSchemaError(err), errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("%w: idemflow's schema version cannot be read (%w)", ErrNotMigrated, err)
	}
	return 0, fmt.Errorf("store: read idemflow's schema version: %w", err)
}

// IsSchemaError reports whether err is PostgreSQL's refusal of a statement
// that does not fit the database's schema: it names a column, table,
// function, type or constraint that is not there (or not unique), or a type
// that does not match. Those are what a statement of an older build meets on
// a schema that a migration that is not rolling changed.
func IsSchemaError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "42703", // undefined_column
		"42P01", // undefined_table
		"42883", // undefined_function
		"42704", // undefined_object (a type, a constraint)
		"42702", // ambiguous_column
		"42725", // ambiguous_function
		"42P10", // invalid_column_reference (ON CONFLICT without its unique index)
		"42804", // datatype_mismatch
		"42846", // cannot_coerce
		"42809": // wrong_object_type
		return true
	}
	return false
}

// CheckStatements asks PostgreSQL to parse every statement that this build's
// store sends (each query under queries/) against pool's database, running
// none: in one read-only transaction, a Parse and Describe per statement, no
// Execute. It returns the first statement's error, naming its query, when one
// does not fit the schema (IsSchemaError matches it), or the error of a
// database that does not answer. About 70 round trips: for a database ahead
// of this build, not for every health check.
func CheckStatements(ctx context.Context, pool *pgxpool.Pool) error {
	stmts, err := buildStatements()
	if err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		for _, s := range stmts {
			// The unnamed statement: described, never kept on the connection.
			if _, err := tx.Prepare(ctx, "", s.sql); err != nil {
				return fmt.Errorf("store: %s does not fit the schema: %w", s.query, err)
			}
		}
		return nil
	})
}

// statement is a query of the store and the SQL it sends.
type statement struct {
	query, sql string
}

// buildStatements are the statements of every query that sqlc generated for
// the store, read once. Each generated method is called with zero arguments
// on a DBTX that records its SQL instead of sending it: the list is whatever
// sqlc generated, with nothing to keep up to date by hand.
var buildStatements = sync.OnceValues(func() ([]statement, error) {
	q := reflect.ValueOf(dbsqlc.New())
	ctxType := reflect.TypeFor[context.Context]()
	dbType := reflect.TypeFor[dbsqlc.DBTX]()
	var out []statement
	for i := range q.NumMethod() {
		m, name := q.Method(i), q.Type().Method(i).Name
		t := m.Type()
		if t.NumIn() < 2 || t.In(0) != ctxType || t.In(1) != dbType {
			return nil, fmt.Errorf("store: query %s does not take (context.Context, DBTX, ...)", name)
		}
		rec := &recorder{}
		args := []reflect.Value{reflect.ValueOf(context.Background()), reflect.ValueOf(rec)}
		for j := 2; j < t.NumIn(); j++ {
			args = append(args, reflect.Zero(t.In(j)))
		}
		m.Call(args)
		if rec.sql == "" {
			return nil, fmt.Errorf("store: query %s sent no statement", name)
		}
		out = append(out, statement{query: name, sql: rec.sql})
	}
	return out, nil
})

// errRecorded is what a recorder answers every statement with.
var errRecorded = errors.New("store: statement recorded, not sent")

// recorder is a DBTX that keeps the SQL of the last statement sent to it and
// answers it with errRecorded.
type recorder struct{ sql string }

func (r *recorder) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	r.sql = sql
	return pgconn.CommandTag{}, errRecorded
}

func (r *recorder) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	r.sql = sql
	return nil, errRecorded
}

func (r *recorder) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	r.sql = sql
	return FailedRow(errRecorded)
}
