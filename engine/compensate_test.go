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
)

// TestCompensationRetriesBoundedAcrossRuns: a compensation that keeps failing
// transiently is retried while the compensated step's policy allows, then
// parks the operation, half undone, for an operator, "rather than retrying
// forever" (run.compensationFailed). Every retry of a compensation is a River
// job, so the bound must hold across runs. The operator's retry, once the
// cause is mended, goes on compensating: it does not run the operation
// forward, and its error stays the step's.
func TestCompensationRetriesBoundedAcrossRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	const maxAttempts = 3
	var broken atomic.Bool
	broken.Store(true)
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: maxAttempts},
		payFault: func(int) (bool, error) { return false, engine.Fail("declined", "the provider declined the payment") },
		undoFault: func(int) error {
			if broken.Load() {
				return errors.New("ledger unavailable")
			}
			return nil
		},
	}
	op := f.op(t, "undo_fails")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	fsHurry(t, pool)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	// Until it stops, or the compensation has run more often than allowed.
	info := fsAwait(t, e, s.ID, "parked, finished, or compensated too often", func(i *engine.Info) bool {
		return i.Parked || i.Status != engine.StatusInProgress || f.debitUndos.Load() > maxAttempts
	})
	require.Equal(t, engine.StatusInProgress, info.Status, "a half-undone operation answered (after %d attempts of the compensation, MaxAttempts %d)", f.debitUndos.Load(), maxAttempts)
	require.True(t, info.Parked)
	require.True(t, info.NeedsAttention())
	require.EqualValues(t, engine.CodeCompensationFailed, info.Attention.Code)
	require.Contains(t, info.Attention.Reason, "debit")
	require.Equal(t, int32(maxAttempts), f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool), "a failed compensation writes nothing")
	fsNoMoreRuns(t, e, pool, s.ID)
	require.Equal(t, int32(maxAttempts), f.debitUndos.Load(), "a parked operation was compensated again")

	broken.Store(false)
	require.NoError(t, errOf(e.Retry(ctx, s.ID, nil)), nil)
	done := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.EqualValues(t, "declined", done.Error.Code, "the reopened operation lost its error")
	require.Equal(t, int32(1), f.payCalls.Load(), "the reopened operation ran forward")
	require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
	require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(fsGet(t, e, s.ID)))
}
