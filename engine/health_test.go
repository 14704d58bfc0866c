package engine_test

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/store"
)

// Migrations of a newer build, played on the test's own database: what one
// that is not rolling does (as 00015 renamed key_secret, a column that every
// start of the builds before it names), what a rolling one does, and how each
// is undone.
const (
	notRollingUp   = `ALTER TABLE idemflow_operation RENAME COLUMN key_seed TO key_seed_v2; UPDATE idemflow_schema_version SET version = version + 1`
	notRollingDown = `ALTER TABLE idemflow_operation RENAME COLUMN key_seed_v2 TO key_seed; UPDATE idemflow_schema_version SET version = version - 1`
	rollingUp      = `CREATE TABLE idemflow_newer (id bigint PRIMARY KEY); UPDATE idemflow_schema_version SET version = version + 2`
)

// healthSetup returns an engine without workers, its operation, its pool and
// what it logs.
func healthSetup(t *testing.T) (*engine.Engine, *engine.Operation[transferIn, transferState, transferOut], *pgxpool.Pool, *syncBuffer) {
	t.Helper()
	pool := setupPool(t)
	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{})
	logs := &syncBuffer{}
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, op)
	return e, op, pool, logs
}

// buildVersion is the latest of idemflow's migrations in this build.
func buildVersion(t *testing.T) int {
	t.Helper()
	files, err := fs.Glob(store.Migrations(), "*.sql")
	require.NoError(t, err)
	return len(files)
}

func operationCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_operation`).Scan(&n))
	return n
}

func TestHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := transferIn{From: "a", To: "b", Amount: 5}
	next := buildVersion(t) + 1

	// A newer build's migration that is not rolling: Health says so, starts
	// (new keys and replays) and reads are refused with nothing reserved,
	// the reason is logged once, naming the migration, and the database
	// moved back clears it.
	t.Run("NotRolling", func(t *testing.T) {
		t.Parallel()
		e, op, pool, logs := healthSetup(t)
		require.NoError(t, e.Health(ctx))
		done, err := engine.Start(ctx, e, op, "s", "before", in, nil)
		require.NoError(t, err)
		waitDone(t, e, done)

		_, err = pool.Exec(ctx, notRollingUp)
		require.NoError(t, err)
		err = e.Health(ctx)
		require.ErrorIs(t, err, engine.ErrIncompatibleSchema)
		require.True(t, engine.IsUnavailable(err))
		require.ErrorIs(t, e.Health(ctx), engine.ErrIncompatibleSchema, "again, from what it found")
		require.Equal(t, 1, strings.Count(logs.String(), "this process cannot work on the database"), logs.String())
		require.Contains(t, logs.String(), fmt.Sprintf("idemflow migration %d,", next))

		for _, key := range []string{"new", "before"} {
			_, err = engine.Start(ctx, e, op, "s", key, in, nil)
			require.ErrorIs(t, err, engine.ErrIncompatibleSchema, key)
			require.True(t, engine.IsUnavailable(err), key)
		}
		require.Equal(t, 1, operationCount(t, pool), "nothing reserved")

		_, err = pool.Exec(ctx, notRollingDown)
		require.NoError(t, err)
		require.NoError(t, e.Health(ctx))
		s, err := engine.Start(ctx, e, op, "s", "new", in, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, waitDone(t, e, s).Status)
	})

	// No health check comes first: the start whose statement fails gives
	// the verdict, and Health and reads have it.
	t.Run("StartFirst", func(t *testing.T) {
		t.Parallel()
		e, op, pool, logs := healthSetup(t)
		done, err := engine.Start(ctx, e, op, "s", "before", in, nil)
		require.NoError(t, err)
		waitDone(t, e, done)
		_, err = pool.Exec(ctx, notRollingUp)
		require.NoError(t, err)

		_, err = engine.Start(ctx, e, op, "s", "before", in, nil)
		require.ErrorIs(t, err, engine.ErrIncompatibleSchema, "a replay")
		require.Contains(t, logs.String(), fmt.Sprintf("idemflow migration %d,", next))
		require.ErrorIs(t, e.Health(ctx), engine.ErrIncompatibleSchema)
		_, err = e.Get(ctx, done.ID)
		require.ErrorIs(t, err, engine.ErrIncompatibleSchema)
		_, err = engine.Start(ctx, e, op, "s", "new", in, nil)
		require.ErrorIs(t, err, engine.ErrIncompatibleSchema)
		require.Equal(t, 1, operationCount(t, pool), "nothing reserved")
		require.Equal(t, 1, strings.Count(logs.String(), "this process cannot work on the database"), logs.String())
	})

	// A rolling migration (a table added): the build's statements fit the
	// schema, and the engine serves.
	t.Run("Rolling", func(t *testing.T) {
		t.Parallel()
		e, op, pool, logs := healthSetup(t)
		_, err := pool.Exec(ctx, rollingUp)
		require.NoError(t, err)
		require.NoError(t, e.Health(ctx))
		require.Contains(t, logs.String(), fmt.Sprintf("idemflow migrations %d to %d,", next, next+1))
		s, err := engine.Start(ctx, e, op, "s", "k", in, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, waitDone(t, e, s).Status)
	})

	// A process that starts its workers on a database it cannot work on
	// refuses to start.
	t.Run("StartWorkers", func(t *testing.T) {
		t.Parallel()
		e, _, pool, _ := healthSetup(t)
		_, err := pool.Exec(ctx, notRollingUp)
		require.NoError(t, err)
		require.ErrorIs(t, e.StartWorkers(ctx), engine.ErrIncompatibleSchema)
	})

	t.Run("NotMigrated", func(t *testing.T) {
		t.Parallel()
		e, _, pool, _ := healthSetup(t)
		_, err := pool.Exec(ctx, `UPDATE idemflow_schema_version SET version = version - 1`)
		require.NoError(t, err)
		require.ErrorIs(t, e.Health(ctx), engine.ErrNotMigrated)
	})
}

// TestHealthResume: a resume job that a process runs after a newer build's
// migration that is not rolling is put back (snoozed) rather than failed, so
// that it uses up no attempt, and a process that can run it does.
func TestHealthResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{workers: true})
	pool := b.pool

	// An operation handed to a River job that is not due yet.
	var started *engine.Started
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		if started, err = engine.StartTx(ctx, tx, e, op, "s", "k", transferIn{From: "a", To: "b", Amount: 5}, nil); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE river_job SET state = 'scheduled', scheduled_at = now() + interval '1 hour' WHERE kind = 'idemflow_resume'`)
		return err
	}))

	_, err := pool.Exec(ctx, notRollingUp)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE river_job SET state = 'available', scheduled_at = now() WHERE kind = 'idemflow_resume'`)
	require.NoError(t, err)
	snoozed := func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce((metadata->>'snoozes')::int, 0) FROM river_job WHERE kind = 'idemflow_resume'`).Scan(&n))
		return n > 0
	}
	require.Eventually(t, snoozed, fsTimeout, 10*time.Millisecond, "the job is put back")
	require.ErrorIs(t, e.Health(ctx), engine.ErrIncompatibleSchema)

	_, err = pool.Exec(ctx, notRollingDown)
	require.NoError(t, err)
	require.NoError(t, e.Health(ctx))
	fsHurry(t, pool)
	require.Equal(t, engine.StatusSucceeded, waitDone(t, e, started).Status)
	var attempts int
	var errs []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempt, coalesce(array_to_json(errors), '[]')::text FROM river_job WHERE kind = 'idemflow_resume'`).Scan(&attempts, &errs))
	require.Equal(t, "[]", string(errs), "no attempt failed")
	require.Equal(t, 1, attempts, "the one that ran it")
}
