package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/store"
)

// schemaRecheck is how often a process that found its build's statements do
// not fit the database's schema reads the schema's version again, when it
// refuses a start: the database may have been moved back to its version.
const schemaRecheck = 5 * time.Second

// schemaReadTimeout bounds the read of the schema's version after a statement
// failed on it.
const schemaReadTimeout = 2 * time.Second

// schemaWatch is what the engine knows of a database whose idemflow schema a
// newer build migrated past this build's.
type schemaWatch struct {
	// verdict is nil while the database is not ahead of this build (or it
	// has not been read since).
	verdict atomic.Pointer[schemaVerdict]
	// checking is held while the build's statements are checked against the
	// schema, so that concurrent health checks check once, and while a
	// statement's failure is recorded, so that it is logged once.
	checking sync.Mutex
	// rechecking is true while a refused start reads the version again.
	rechecking atomic.Bool
}

// schemaVerdict is the verdict on one version of the schema, ahead of this
// build's.
type schemaVerdict struct {
	// version is the database's schema version that it is on.
	version int
	// err is nil when this build's statements fit the schema (the migrations
	// past this build's were rolling), else the error that refuses work:
	// ErrIncompatibleSchema.
	err error
	// at is when it was formed or last confirmed.
	at time.Time
}

// Health returns nil while this process can serve: its database answers, and
// idemflow's schema there is one that this build's statements fit. It is for a
// service's health check (the demo's /healthz answers 503 when it fails).
//
// It returns an error matching ErrIncompatibleSchema once a newer build has
// migrated the database past this build's migrations with one that is not
// rolling (store migration 00015, for one, renames a column that the builds
// before it name in every start): this process cannot work there, and should
// be replaced by one of the newer build. Until then its starts are refused at
// once, with the same error and nothing reserved (IsUnavailable is true of
// it, so the idempotency package answers them 503 with Retry-After), its
// River workers put back the resume jobs they take (snoozed, using up no
// attempt) for a process of the newer build, and the reason is logged once,
// naming the migrations that this build lacks. A database moved back to this
// build's version clears it. The error matches
// ErrNotMigrated when the database lacks this build's migrations, and
// errUnavailable when the database does not answer within ctx.
//
// It reads one row (the schema's version) on Config.ControlPool. Only while
// the database is ahead of this build does it check this build's statements
// against the schema, once per version there: PostgreSQL parses each, and
// runs none. A start, a read (Get, GetByKey) or a resume whose statement
// fails on the schema while the database is ahead gives the same verdict at
// once.
func (e *Engine) Health(ctx context.Context) error {
	database, build, err := store.SchemaVersions(ctx, e.control)
	switch {
	case err != nil && IsUnavailable(err):
		return fmt.Errorf("engine: %w: %w", errUnavailable, err)
	case err != nil:
		return fmt.Errorf("engine: %w", err)
	case database <= build:
		e.schema.verdict.Store(nil)
		if database < build {
			return fmt.Errorf("engine: %w: idemflow's schema is at version %d, this build needs %d", ErrNotMigrated, database, build)
		}
		return nil
	}
	e.schema.checking.Lock()
	defer e.schema.checking.Unlock()
	if v := e.schema.verdict.Load(); v != nil && v.version == database {
		if v.err != nil {
			e.schema.verdict.Store(&schemaVerdict{version: database, err: v.err, at: time.Now()})
		}
		return v.err
	}
	err = store.CheckStatements(ctx, e.control)
	switch {
	case store.IsSchemaError(err):
		return e.incompatible(ctx, database, build, err)
	case err != nil && IsUnavailable(err):
		return fmt.Errorf("engine: %w: %w", errUnavailable, err)
	case err != nil:
		return fmt.Errorf("engine: %w", err)
	}
	e.schema.verdict.Store(&schemaVerdict{version: database, at: time.Now()})
	e.logger.InfoContext(ctx, "a newer build applied idemflow "+migrationsPast(build, database)+
		", which this build lacks; this build's statements fit the schema (rolling migrations): serving",
		slog.Int("schema_version", database), slog.Int("build_schema_version", build))
	return nil
}

// incompatible records, and returns, the verdict that this build's statements
// do not fit the database's schema at version database (cause is a statement's
// error), and logs it when it is new.
func (e *Engine) incompatible(ctx context.Context, database, build int, cause error) error {
	err := fmt.Errorf("engine: %w: a newer build applied idemflow %s, which this build (at version %d) lacks: %w",
		ErrIncompatibleSchema, migrationsPast(build, database), build, cause)
	prev := e.schema.verdict.Swap(&schemaVerdict{version: database, err: err, at: time.Now()})
	if prev == nil || prev.err == nil || prev.version != database {
		e.logger.ErrorContext(ctx, "this process cannot work on the database: a newer build applied idemflow "+
			migrationsPast(build, database)+", which this build lacks, and this build's statements fail on the schema; "+
			"it reports itself unhealthy and refuses new operations: replace it with a process of the newer build",
			slog.Int("schema_version", database), slog.Int("build_schema_version", build), slog.Any("error", cause))
	}
	return err
}

// migrationsPast names the migrations after build up to database: "migration
// 17", "migrations 17 to 18".
func migrationsPast(build, database int) string {
	if database == build+1 {
		return "migration " + strconv.Itoa(database)
	}
	return "migrations " + strconv.Itoa(build+1) + " to " + strconv.Itoa(database)
}

// schemaFault returns, for the error of a statement of the engine's that
// PostgreSQL refused because it does not fit the schema (store.IsSchemaError),
// the verdict that this build is behind its database, when one read of the
// schema's version says it is; nil otherwise, for any other error, and for a
// statement that fails on this build's own schema (a bug, answered as any
// error).
func (e *Engine) schemaFault(ctx context.Context, err error) error {
	if !store.IsSchemaError(err) {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), schemaReadTimeout)
	defer cancel()
	database, build, verr := store.SchemaVersions(rctx, e.control)
	if verr != nil || database <= build {
		return nil
	}
	e.schema.checking.Lock() // so that concurrent starts log it once
	defer e.schema.checking.Unlock()
	return e.incompatible(ctx, database, build, err)
}

// schemaRefusal returns the error that refuses a start at once, reserving
// nothing, while this build's statements are known not to fit the database's
// schema, and nil otherwise (one atomic load). Every schemaRecheck one
// refused start reads the schema's version again, which clears the verdict
// when the database was moved back.
func (e *Engine) schemaRefusal(ctx context.Context) error {
	v := e.schema.verdict.Load()
	if v == nil || v.err == nil {
		return nil
	}
	if time.Since(v.at) < schemaRecheck || !e.schema.rechecking.CompareAndSwap(false, true) {
		return v.err
	}
	defer e.schema.rechecking.Store(false)
	rctx, cancel := context.WithTimeout(ctx, schemaReadTimeout)
	defer cancel()
	_ = e.Health(rctx) // renews the verdict, or clears it; unread, it stays
	if v := e.schema.verdict.Load(); v != nil && v.err != nil {
		return v.err
	}
	return nil
}

// statementErr is the error of a public call whose statement failed with
// err: ErrNotFound for store.ErrNotFound, the verdict of schemaFault for a
// statement that does not fit a newer build's schema, else err.
func (e *Engine) statementErr(ctx context.Context, err error) error {
	if fault := e.schemaFault(ctx, err); fault != nil {
		return fault
	}
	return mapNotFound(err)
}
