package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// TestSweeperResumesOperationWhoseJobIsGone loses a retry's River job and checks
// that the sweeper hands the operation to a worker once its lease has expired,
// and that the lookup completes the lost payout without a second call.
func TestSweeperResumesOperationWhoseJobIsGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{inlineRetry: -1, retry: engine.RetryPolicy{Base: time.Hour}})
	b.lostPayout.Store(1)
	s, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
	require.NoError(t, err)
	// The first attempt paid out, lost the answer and handed the operation to a
	// River job an hour away. Lose the job, and let the hour pass.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.Wait(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	tag, err := b.pool.Exec(ctx, `DELETE FROM river_job WHERE kind = 'idemflow_resume'`)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	_, err = b.pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second'`)
	require.NoError(t, err)

	require.NoError(t, e.StartWorkers(ctx))
	info := waitDone(t, e, s)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, int32(1), b.calls.Load(), "no second call: the lookup found the payout")
	require.Equal(t, int32(1), b.lookups.Load())
	require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	got, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, 2, got.Runs)
}

// TestLeaseRenewedDuringLongStep runs a step for several leases while the sweeper
// looks for expired leases: the live run keeps its operation, and the step runs
// once.
func TestLeaseRenewedDuringLongStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupPool(t)
	var calls atomic.Int32
	op, err := engine.NewOperation("long", []engine.Step[int, int]{
		engine.ExternalStep("slow", func(ctx context.Context, call engine.Attempt, in int, s *int) error {
			calls.Add(1)
			select {
			case <-time.After(1500 * time.Millisecond): // five leases
			case <-ctx.Done():
				return ctx.Err()
			}
			*s = in
			return nil
		}),
	}, func(in int, s *int) (int, error) { return *s, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op}, Lease: 300 * time.Millisecond, SweepInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() { require.NoError(t, e.Stop(context.WithoutCancel(ctx))) })

	s, err := engine.Start(ctx, e, op, "c", "k", 7, nil)
	require.NoError(t, err)
	info := waitDone(t, e, s)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, int32(1), calls.Load())
	got, err := e.Get(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Runs, "no other run took the operation over")
}

// TestStopHandsOperationsBack stops an engine in the middle of a step: the run is
// cancelled and releases its operation, which another engine resumes at its next
// sweep, without waiting for the lease to expire.
func TestStopHandsOperationsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupPool(t)
	entered := make(chan struct{}, 1)
	var calls atomic.Int32
	op, err := engine.NewOperation("blocking", []engine.Step[int, int]{
		engine.ExternalStep("wait", func(ctx context.Context, call engine.Attempt, in int, s *int) error {
			if calls.Add(1) == 1 {
				entered <- struct{}{}
				<-ctx.Done() // the first run waits for the engine to stop
				return ctx.Err()
			}
			*s = in
			return nil
		}),
	}, func(in int, s *int) (int, error) { return *s, nil }, nil)
	require.NoError(t, err)
	// With an hour's lease, only the release lets another engine resume it.
	first, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Lease: time.Hour})
	require.NoError(t, err)
	s, err := engine.Start(ctx, first, op, "c", "k", 3, nil)
	require.NoError(t, err)
	<-entered
	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, first.Stop(stopCtx), context.DeadlineExceeded)

	second := idemflowtest.Engine(t, pool, nil, op)
	waitCtx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	info, err := second.Wait(waitCtx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, int32(2), calls.Load())
}
