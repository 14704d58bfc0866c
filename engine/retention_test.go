package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// TestDerivedKeyAfterRetention: a client key used again after retention
// deleted its operation starts an operation whose external steps get new
// derived keys, so the provider never takes the new call for the old one.
func TestDerivedKeyAfterRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true}
	op := f.op(t, "retained")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
	in := fsIn{Account: "acct", Amount: 100}

	first, err := engine.Start(ctx, e, op, "c", "K", in, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, fsWaitStarted(t, first).Status)
	firstKey := fsGet(t, e, first.ID).Steps[1].DerivedKey
	_, keys := f.recorded()
	require.Equal(t, []string{firstKey}, keys)

	future := time.Now().Add(48 * time.Hour)
	n, err := e.DeleteFinished(ctx, &future)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = e.Get(ctx, first.ID)
	require.ErrorIs(t, err, engine.ErrNotFound)

	second, err := engine.Start(ctx, e, op, "c", "K", in, nil)
	require.NoError(t, err)
	require.True(t, second.Created)
	require.NotEqual(t, first.ID, second.ID)
	require.Equal(t, engine.StatusSucceeded, fsWaitStarted(t, second).Status)
	_, keys = f.recorded()
	require.Len(t, keys, 2)
	require.NotEqual(t, keys[0], keys[1], "the key's new operation got the old derived key")
	for _, k := range keys {
		require.True(t, strings.HasPrefix(k, "idf3_"), "key %q", k)
		require.True(t, strings.HasPrefix(k, "idf3_"), "key %q", k)
	}
	require.Equal(t, keys[1], fsGet(t, e, second.ID).Steps[1].DerivedKey)
	require.Equal(t, fsBooks{debits: 2, payments: 2, requests: 2, bookings: 2}, fsReadBooks(t, pool))
}

func TestDeleteFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{})

	// Two finished operations through the engine, and one left waiting for a job.
	for _, key := range []string{"done-1", "done-2"} {
		s, err := engine.Start(ctx, e, op, "c", key, transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		waitDone(t, e, s)
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	waiting, err := engine.StartTx(ctx, tx, e, op, "c", "waiting", transferIn{From: "a", To: "b", Amount: 1}, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	// And enough old finished rows to take more than one batch.
	_, err = b.pool.Exec(ctx, `INSERT INTO idemflow_operation (id, name, scope, key, state, steps, input, locked_until, created_at, finished_at, format)
		SELECT gen_random_uuid(), 'transfer', 'bulk', 'k' || i, 'succeeded', '{ledger}', '{}', now(), now() - interval '3 days', now() - interval '3 days', 2
		FROM generate_series(1, 2500) i`)
	require.NoError(t, err)
	count := func() (finished, inProgress int) {
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state <> 'in_progress'), count(*) FILTER (WHERE state = 'in_progress') FROM idemflow_operation`).Scan(&finished, &inProgress))
		return finished, inProgress
	}

	n, err := e.DeleteFinished(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, 2500, n, "only the rows past the 24-hour default horizon")
	finished, inProgress := count()
	require.Equal(t, 2, finished)
	require.Equal(t, 1, inProgress)

	n, err = e.DeleteFinished(ctx, ptr(time.Now().Add(25*time.Hour)))
	require.NoError(t, err)
	require.Equal(t, 2, n)
	finished, inProgress = count()
	require.Zero(t, finished)
	require.Equal(t, 1, inProgress, "operations in progress are never deleted")
	var steps int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_step_recorded`).Scan(&steps))
	require.Zero(t, steps, "steps go with their operation")
	require.Equal(t, books{ledgerRows: 4, payouts: 2, payoutCalls: 2, finals: 2}, readBooks(t, b.pool), "business rows stay")
	_, err = e.Get(ctx, waiting.ID)
	require.NoError(t, err)

	// A key whose operation was deleted starts a new operation.
	again, err := engine.Start(ctx, e, op, "c", "done-1", transferIn{From: "a", To: "b", Amount: 1}, nil)
	require.NoError(t, err)
	require.True(t, again.Created)
	waitDone(t, e, again)
}

// shortOp is an operation type "short" of one step, kept retention.
func shortOp(t *testing.T, retention time.Duration) *engine.Operation[int, int, int] {
	t.Helper()
	op, err := engine.NewOperation("short", []engine.Step[int, int]{
		engine.TxStep("only", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return in, nil }, &engine.OperationOpts{Retention: retention})
	require.NoError(t, err)
	return op
}

// finishLongAndShort finishes a transfer (the engine's default retention) and
// an operation of shortOp (an hour's), and returns the engine and their ids.
func finishLongAndShort(t *testing.T) (e *engine.Engine, pool *pgxpool.Pool, long, short uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	pool = setupPool(t)
	b := &bundle{pool: pool}
	longOp, hourOp := b.transferOp(t, engine.RetryPolicy{}), shortOp(t, time.Hour)
	e = idemflowtest.Engine(t, pool, nil, longOp, hourOp)
	s1, err := engine.Start(ctx, e, longOp, "c", "long", transferIn{From: "a", To: "b", Amount: 1}, nil)
	require.NoError(t, err)
	waitDone(t, e, s1)
	s2, err := engine.Start(ctx, e, hourOp, "c", "short", 1, nil)
	require.NoError(t, err)
	waitDone(t, e, s2)
	return e, pool, s1.ID, s2.ID
}

func TestDeleteFinishedPerTypeRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, _, long, short := finishLongAndShort(t)

	n, err := e.DeleteFinished(ctx, ptr(time.Now().Add(2*time.Hour)))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = e.Get(ctx, short)
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = e.Get(ctx, long)
	require.NoError(t, err)
}

// TestRetentionStoredAtFinish: an operation is kept for the retention of the
// process that finished it, stored with it then. Another process (one that
// does not run the type, or a later deploy with a shorter retention) never
// frees its key earlier.
func TestRetentionStoredAtFinish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, pool, long, short := finishLongAndShort(t)

	// A process that runs neither type, and keeps what it finishes a minute.
	other, err := engine.New(pool, &engine.Config{Retention: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Stop(context.Background()) })
	n, err := other.DeleteFinished(ctx, ptr(time.Now().Add(30*time.Minute)))
	require.NoError(t, err)
	require.Zero(t, n, "deleted by another process's retention")

	// A later deploy of the type with a minute's retention.
	deployed, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{shortOp(t, time.Minute)}, Retention: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = deployed.Stop(context.Background()) })
	n, err = deployed.DeleteFinished(ctx, ptr(time.Now().Add(30*time.Minute)))
	require.NoError(t, err)
	require.Zero(t, n, "deleted by a retention shortened after it finished")

	// Past the hour: the short one goes, whoever deletes; the long one stays
	// its 24 hours.
	n, err = other.DeleteFinished(ctx, ptr(time.Now().Add(2*time.Hour)))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = e.Get(ctx, short)
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = e.Get(ctx, long)
	require.NoError(t, err)
	n, err = deployed.DeleteFinished(ctx, ptr(time.Now().Add(25*time.Hour)))
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func ptr[T any](v T) *T { return &v }
