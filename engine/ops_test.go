package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

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
	n, err := other.DeleteFinished(ctx, ptr(time.Now().Add(30*time.Minute)))
	require.NoError(t, err)
	require.Zero(t, n, "deleted by another process's retention")

	// A later deploy of the type with a minute's retention.
	deployed, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{shortOp(t, time.Minute)}, Retention: time.Minute})
	require.NoError(t, err)
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

func TestOperatorRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{workers: true, retry: engine.RetryPolicy{MaxAttempts: 2}})
	b.failPayout.Store(1000)
	s, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
	require.NoError(t, err)
	info := waitDone(t, e, s)
	require.Equal(t, engine.CodeAttemptsExhausted, info.Error.Code)
	failed, err := e.List(ctx, &engine.ListOpts{Status: engine.StatusFailed, Max: 10})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, s.ID, failed[0].ID)

	// A server fault is the client's answer: only a forced retry reopens it.
	require.ErrorIs(t, e.Retry(ctx, s.ID, nil), engine.ErrFinal)
	require.NoError(t, e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true}))
	b.failPayout.Store(0)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err = e.Wait(ctx2, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	// The first run's ledger move was reversed; the retry moved it again: once, net.
	require.Equal(t, books{ledgerRows: 4, reversals: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	require.ErrorIs(t, e.Retry(ctx, s.ID, nil), engine.ErrNotFailed)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("WaitingOperationCompensated", func(t *testing.T) {
		t.Parallel()
		// The retry is an hour away, in a River job that no worker runs.
		e, op, b := setup(t, setupOpts{inlineRetry: -1, retry: engine.RetryPolicy{Base: time.Hour}})
		b.failPayout.Store(1)
		s, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
		require.NoError(t, err)
		shortCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = s.Wait(shortCtx)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		info, err := e.Cancel(ctx, s.ID, "customer gave up")
		require.NoError(t, err)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, engine.CodeCancelled, info.Error.Code)
		require.Equal(t, "customer gave up", info.Error.Cause)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, books{ledgerRows: 2, reversals: 2}, readBooks(t, b.pool))

		_, err = e.Cancel(ctx, s.ID, "")
		require.ErrorIs(t, err, engine.ErrFinished)
	})

	t.Run("RunningOperationRefused", func(t *testing.T) {
		t.Parallel()
		pool := setupPool(t)
		release := make(chan struct{})
		entered := make(chan struct{})
		op, err := engine.NewOperation("slow", []engine.Step[int, int]{
			engine.ExternalStep("wait", func(ctx context.Context, call engine.Attempt, in int, s *int) error {
				close(entered)
				<-release
				return nil
			}),
		}, func(in int, s *int) (int, error) { return in, nil }, nil)
		require.NoError(t, err)
		e := idemflowtest.Engine(t, pool, nil, op)
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		<-entered
		_, err = e.Cancel(ctx, s.ID, "")
		require.ErrorIs(t, err, engine.ErrRunning)
		close(release)
		waitDone(t, e, s)
	})
}

func ptr[T any](v T) *T { return &v }

// TestFingerprintOfAnEarlierVersion: an operation stored with a version 2
// fingerprint (whole SHA-256 hashes in hex) is recognised by a start of the
// same input after the deploy that shortened the hashes, and one of another
// input is still refused, naming the field.
func TestFingerprintOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{})
	in := transferIn{From: "a", To: "b", Amount: 1}
	s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	waitDone(t, e, s)
	// As a version 2 process stored it: {"v": 2, "fields": {name: hex SHA-256}}.
	_, err = b.pool.Exec(ctx, `UPDATE idemflow_operation
		SET fingerprint = jsonb_build_object('v', 2, 'fields', (
			SELECT jsonb_object_agg(f.key, encode(sha256(convert_to(f.value, 'UTF8')), 'hex'))
			FROM json_each_text(json_build_object('from', '"a"', 'to', '"b"', 'amount', '1')) AS f))
		WHERE id = $1`, s.ID)
	require.NoError(t, err)

	again, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err, "a retry refused after the deploy")
	require.False(t, again.Created)
	require.Equal(t, s.ID, again.ID)

	_, err = engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 2}, nil)
	var reused *engine.KeyReusedError
	require.ErrorAs(t, err, &reused)
	require.Equal(t, []string{"amount"}, reused.Fields)
}
