package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

func TestOperatorRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e, op, b := setup(t, setupOpts{workers: true, retry: engine.RetryPolicy{MaxAttempts: 2}})
	b.failPayout.Store(1000)
	s, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
	require.NoError(t, err)
	info := waitDone(t, e, s)
	require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
	failed, err := e.List(ctx, &engine.ListOpts{Status: engine.StatusFailed, Max: 10})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, s.ID, failed[0].ID)

	// A server fault is the client's answer: only a forced retry reopens it.
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrFinal)
	require.NoError(t, errOf(e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true})))
	b.failPayout.Store(0)
	ctx2, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err = e.Wait(ctx2, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	// The first run's ledger move was reversed; the retry moved it again: once, net.
	require.Equal(t, books{ledgerRows: 4, reversals: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrNotFailed)
}

// TestReopenRefusesCompensatedCall: an operation whose external step was
// compensated is not run forward again: under the same derived key its call
// would be answered with the one that was undone, and the step would read as
// done. Retry refuses, changing nothing; a new key asks again.
func TestReopenRefusesCompensatedCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true, undoablePay: true, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3},
		bookFault: func(int) error { return engine.Permanent(errors.New("the books are closed")) },
	}
	op := f.op(t, "undo_call")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	failed := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, failed.Status)
	require.EqualValues(t, engine.CodePermanent, failed.Error.Code)
	require.Equal(t, int32(1), f.payUndos.Load())
	before := fsStatuses(fsGet(t, e, s.ID))
	require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusFailed}, before)

	// A server fault reopens only when forced.
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrFinal)
	err = errOf(e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true}))
	require.ErrorIs(t, err, engine.ErrCompensated)
	require.Contains(t, err.Error(), "pay")
	fsNoMoreRuns(t, e, pool, s.ID)
	after := fsGet(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, after.Status)
	require.EqualValues(t, engine.CodePermanent, after.Error.Code)
	require.Equal(t, before, fsStatuses(after))
	require.Equal(t, int32(1), f.payCalls.Load())
	require.Equal(t, fsBooks{debits: 1, reversals: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))
}

// TestReopenRefusesAHeldOperation: a parked operation that a live run holds
// (an operator's cancel, compensating it) is not reopened under it.
func TestReopenRefusesAHeldOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 2},
		payFault: func(int) (bool, error) { return false, errors.New("connection reset") },
	}
	op := f.op(t, "held")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	// Out of attempts with no lookup: parked, its outcome unknown.
	info := fsAwait(t, e, s.ID, "parked", fsParked)
	require.EqualValues(t, engine.CodeOutcomeUnknown, info.Attention.Code)

	// As a cancel's claim leaves it while it compensates.
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_by = gen_random_uuid(), locked_until = now() + interval '1 hour' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrRunning)
	again := fsGet(t, e, s.ID)
	require.True(t, again.Parked, "reopened under its holder")
	require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool), "nothing undone while the outcome is unknown")

	// Its holder gone (the lease expired), it reopens.
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	require.NoError(t, errOf(e.Retry(ctx, s.ID, nil)), nil)
}
