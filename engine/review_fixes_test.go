package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

// Cases found in review. Each failed before its fix.

// TestErrorTextThatIsNotUTF8: a step's error text that PostgreSQL cannot keep
// (a provider's body cut in the middle of a character, a NUL byte) is still
// recorded, so attempts are counted and MaxAttempts reached; it had failed the
// write that records the failure, every run, for ever.
func TestErrorTextThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{
		pool:   pool,
		lookup: true,
		retry:  engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 3},
		payFault: func(int) (bool, error) {
			body := "Erreur du fournisseur: réessayez"
			return false, errors.New("provider answered 502: " + body[:25] + "\x00")
		},
	}
	op := f.op(t, "review_utf8")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: 300 * time.Millisecond}, op)
	require.NoError(t, e.StartWorkers(ctx))
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	info := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, info.Status, "out of attempts, the lookup found nothing: compensated")
	require.Equal(t, engine.CodeAttemptsExhausted, info.Error.Code)
	require.Equal(t, int32(3), f.payCalls.Load())
	got := fsGet(t, e, s.ID)
	require.Equal(t, 3, got.Steps[1].Attempts)
	require.Contains(t, got.Steps[1].LastCause, "Erreur du fournisseur")
}

// TestStoredWithoutFingerprint: an operation that an earlier release started
// with no fingerprint (NULL) is compared by its stored input: the same input is
// the same start, another is a reused key.
func TestStoredWithoutFingerprint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true}
	op := f.op(t, "review_fp")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	in := fsIn{Account: "acct", Amount: 100}
	s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	fsWait(t, e, s.ID)
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET fingerprint = NULL WHERE id = $1`, s.ID)
	require.NoError(t, err)

	again, err := engine.Start(ctx, e, op, "c", "k", in, nil)
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, s.ID, again.ID)
	_, err = engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 101}, nil)
	var reused *engine.KeyReusedError
	require.ErrorAs(t, err, &reused)
	require.Equal(t, []string{"amount"}, reused.Fields)
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

	b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	_, err := b.Cancel(ctx, id, "customer withdrew")
	require.ErrorIs(t, err, engine.ErrPastPivot)
	require.Equal(t, before, fsReadBooks(t, pool), "nothing undone")
	require.Equal(t, engine.StatusInProgress, fsGet(t, b, id).Status)
}
