package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

// TestCancelPastPivot: Cancel refuses, changing nothing, an operation whose
// pivot has succeeded, recorded or not (its lookup finds the call), and
// compensates one whose pivot's call did not go through.
func TestCancelPastPivot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CheckpointRecorded", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var busy atomic.Bool
		busy.Store(true)
		f := &fsFlow{
			pool:      pool,
			lookup:    true,
			bookRetry: engine.RetryPolicy{Base: time.Hour}, // the retry is an hour away
			bookFault: func(int) error {
				if busy.Load() {
					return errors.New("ledger busy")
				}
				return nil
			},
		}
		op := f.op(t, "cancel_recorded")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		before := fsAwait(t, e, s.ID, "book's first failure recorded", func(i *engine.Info) bool { return i.Steps[2].Attempts == 1 })

		_, err = e.Cancel(ctx, s.ID, "customer withdrew")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		info := fsGet(t, e, s.ID)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Equal(t, before.Runs, info.Runs)
		require.Equal(t, 1, info.Steps[2].Attempts)
		require.Nil(t, info.Error)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusRunning}, fsStatuses(info))
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		// The operation is as it was: its retry, brought forward, finishes it
		// once the fault clears.
		busy.Store(false)
		require.NoError(t, e.StartWorkers(ctx))
		fsHurry(t, pool)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("CallWentThroughCheckpointLost", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true}
		op := f.op(t, "cancel_crash_window")
		// The provider recorded the payment; the run was stopped before the
		// checkpoint, which rides with book's transaction, committed.
		id := fsCrashAt(t, pool, op, "pay", faults.PointAfterEffect)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		before := fsGet(t, b, id)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusNotStarted, engine.StepStatusNotStarted}, fsStatuses(before),
			"the rows must not know that the call went through")
		_, err := b.Cancel(ctx, id, "customer withdrew")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		require.Equal(t, int32(1), f.lookups.Load(), "Cancel must ask the lookup")
		info := fsGet(t, b, id)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Nil(t, info.Error)
		require.Equal(t, fsStatuses(before), fsStatuses(info))
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		// It goes forward: the lookup completes the payment without a second call.
		require.NoError(t, b.StartWorkers(ctx))
		done := fsWait(t, b, id)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, b, id)
		require.Equal(t, engine.ResolvedByLookup, got.Steps[1].ResolvedBy)
		require.Equal(t, int32(1), f.payCalls.Load())
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("CallNotMadeCompensates", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true}
		op := f.op(t, "cancel_before_call")
		id := fsCrashAt(t, pool, op, "pay", faults.PointBefore)
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		info, err := b.Cancel(ctx, id, "customer withdrew")
		require.NoError(t, err)
		require.Equal(t, int32(1), f.lookups.Load(), "Cancel must ask the lookup")
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, engine.CodeCancelled, info.Error.Code)
		require.Equal(t, "customer withdrew", info.Error.Cause)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, int32(1), f.debitUndos.Load())
		require.Zero(t, f.payCalls.Load())
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))

		got := fsGet(t, b, id)
		require.Equal(t, engine.StatusFailed, got.Status)
		require.EqualValues(t, engine.CodeCancelled, got.Error.Code)
		require.Equal(t, "customer withdrew", got.Error.Cause)
		require.False(t, got.Error.ServerFault())
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusSkipped, engine.StepStatusSkipped}, fsStatuses(got))
	})
}

// TestRefusedCancelKeepsBackoff: a cancel refused after it claimed the
// operation (the lookup found the pivot's call went through) hands it back
// waiting out its backoff as before, not to the next sweep: the step is not
// tried again early.
func TestRefusedCancelKeepsBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5},
		// The provider records the payment, and the answer is lost.
		payFault: func(int) (bool, error) { return true, errors.New("connection reset") },
	}
	op := f.op(t, "cancel_backoff")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	fsAwait(t, e, s.ID, "waiting out its backoff", func(i *engine.Info) bool {
		return len(i.Steps) == 3 && i.Steps[1].Status == engine.StepStatusRunning && i.Steps[1].Attempts == 1
	})
	leftUntil := func() time.Time {
		var until time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT locked_until FROM idemflow_operation WHERE id = $1`, s.ID).Scan(&until))
		return until
	}
	before := leftUntil()
	require.Greater(t, time.Until(before), 50*time.Minute)

	_, err = e.Cancel(ctx, s.ID, "give up")
	require.ErrorIs(t, err, engine.ErrPastPivot)
	require.Equal(t, int32(1), f.lookups.Load())
	require.WithinDuration(t, before, leftUntil(), time.Second, "the refused cancel moved the operation's wait")
	n := fsResumeJobs(t, pool)
	for range 3 {
		require.NoError(t, e.Sweep(ctx))
	}
	require.Equal(t, n, fsResumeJobs(t, pool), "a sweep enqueued a resume job for the operation")
	require.Equal(t, int32(1), f.payCalls.Load(), "the step was tried again before its backoff")
	require.Equal(t, int32(1), f.lookups.Load())
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool), "the paid debit was not undone")
}

// TestAdminCancelOutlastsLease: a cancel request whose compensation takes
// longer than a lease stays with the process carrying it out: another
// process does not take it again, find the operation running, and record it
// refused while it is being cancelled.
func TestAdminCancelOutlastsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	const lease = time.Second // renewed every third of it: short, but not so short that a loaded -race run misses a renewal
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5},
		payFault: func(int) (bool, error) { return false, errors.New("connection refused") },
		undoFault: func(int) error {
			time.Sleep(4 * lease) // a compensation that outlasts the lease: the point of the test
			return nil
		},
	}
	op := f.op(t, "cancel_slow")
	cfg := &engine.Config{Lease: lease}
	e := idemflowtest.Engine(t, pool, cfg, op)
	idemflowtest.Engine(t, pool, cfg, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	fsAwait(t, e, s.ID, "waiting out its backoff", func(i *engine.Info) bool {
		return len(i.Steps) == 3 && i.Steps[1].Attempts == 1
	})

	admin, err := engine.NewAdmin(ctx, pool)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := admin.Cancel(waitCtx, s.ID, "give up")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeCancelled, info.Error.Code)
	require.Equal(t, int32(1), f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
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
		require.EqualValues(t, engine.CodeCancelled, info.Error.Code)
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

// TestCancelRefusesExternalStepWithoutLookup: after a crash between an
// undoable external step's call and its checkpoint, nothing says the call went
// through, and nothing can ask: Cancel refuses rather than undo the steps
// before it (the call's own compensation would not run).
func TestCancelRefusesExternalStepWithoutLookup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, undoablePay: true} // compensatable, no lookup
	op := f.op(t, "review_cancel")
	id := fsCrashAt(t, pool, op, "pay", faults.PointAfterEffect)
	before := fsReadBooks(t, pool)
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, before)

	b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
	_, err := b.Cancel(ctx, id, "customer withdrew")
	require.ErrorIs(t, err, engine.ErrPastPivot)
	require.Equal(t, before, fsReadBooks(t, pool), "nothing undone")
	require.Equal(t, engine.StatusInProgress, fsGet(t, b, id).Status)
}
