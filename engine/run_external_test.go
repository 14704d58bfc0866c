package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// TestExternalStepOutOfAttempts: an external step out of attempts asks its
// lookup after the last attempt; not found compensates and fails the
// operation, found goes forward; without a lookup the operation is parked and
// nothing is compensated.
func TestExternalStepOutOfAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	retry := engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3}

	t.Run("LookupFindsNothing", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(int) (bool, error) { return false, errors.New("provider unavailable") }}
		op := f.op(t, "out_not_found")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
		require.Equal(t, "pay", info.Error.Step)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:2:missing", "call:2", "lookup:3:missing", "call:3", "lookup:3:missing"}, events,
			"the lookup is asked before each retry and after the last attempt")
		require.Equal(t, int32(1), f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
		require.Equal(t, 3, got.Steps[1].Attempts)
	})

	t.Run("LookupFindsTheCall", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		// The provider is down for two attempts; the third records the payment,
		// and its answer is lost.
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(attempt int) (bool, error) {
				if attempt < 3 {
					return false, errors.New("provider unavailable")
				}
				return true, errors.New("answer lost")
			}}
		op := f.op(t, "out_found")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %+v", info.Error)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:2:missing", "call:2", "lookup:3:missing", "call:3", "lookup:3:found"}, events)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out.PaymentID, "pay_"), "the lookup fills the state: %q", out.PaymentID)
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusSucceeded}, fsStatuses(got))
		require.Equal(t, engine.ResolvedByLookup, got.Steps[1].ResolvedBy)
		require.Equal(t, 3, got.Steps[1].Attempts)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("NoLookupParks", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, retry: retry,
			payFault: func(int) (bool, error) { return false, errors.New("provider unavailable") }}
		op := f.op(t, "out_unknown")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "parked", fsParked)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.True(t, info.NeedsAttention())
		require.EqualValues(t, engine.CodeOutcomeUnknown, info.Attention.Code)
		require.Nil(t, info.Error)
		require.Equal(t, 3, info.Steps[1].Attempts)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		fsNoMoreRuns(t, e, pool, s.ID)
		require.Equal(t, int32(3), f.payCalls.Load())

		// Nobody can tell whether the call went through: Cancel refuses too.
		_, err = e.Cancel(ctx, s.ID, "give up")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		again := fsGet(t, e, s.ID)
		require.True(t, again.Parked)
		require.EqualValues(t, engine.CodeOutcomeUnknown, again.Attention.Code)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))
	})
}

// TestExternalStepTimeout: a call that does not answer within the step's
// Timeout is cut there, an attempt whose outcome is unknown: out of
// attempts, the step waits out its window before anything is undone.
func TestExternalStepTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newLateProvider(func(int32) string { return "hang" })
	op := lateOpWith(t, p, "call_timeout", 1, func(pay engine.ExternalStepDef[int, lateState]) engine.ExternalStepDef[int, lateState] {
		return pay.Timeout(50 * time.Millisecond).Window(100 * time.Millisecond)
	})
	e, _ := lateEngine(t, op)
	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	info := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
	require.Contains(t, info.Error.Cause, context.DeadlineExceeded.Error())
	require.Equal(t, int32(1), p.calls.Load())
	require.Equal(t, int32(1), p.undos.Load())
	pay := fsGet(t, e, s.ID).Steps[1]
	require.NotNil(t, pay.SettleBy, "the window was fixed when the request was sent")
}
