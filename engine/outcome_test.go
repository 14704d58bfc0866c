package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/reconcile"
)

// eventOp is lateOp whose pay step records the reference of a call that an
// outcome or an operator tells, and compares an outcome's amount with the
// input.
func eventOp(t *testing.T, p *lateProvider, name string, settle time.Duration, attempts int) *engine.Operation[int, lateState, string] {
	t.Helper()
	return lateOpWith(t, p, name, attempts, func(pay engine.ExternalStepDef[int, lateState]) engine.ExternalStepDef[int, lateState] {
		return pay.Window(settle).
			FromReference(func(_ int, s *lateState, ref string) error { s.Ref = ref; return nil }).
			Compare(func(in int, rec reconcile.Record) reconcile.Kind {
				if rec.Amount != int64(in) {
					return reconcile.AmountDiffers
				}
				return ""
			}).
			Records("provider", func(s *lateState) string { return s.Ref })
	})
}

// recordOutcome records o in a transaction of its own.
func recordOutcome(t *testing.T, e *engine.Engine, pool *pgxpool.Pool, o engine.Outcome) (bool, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	added, err := e.RecordOutcome(ctx, tx, o)
	if err != nil {
		return false, err
	}
	require.NoError(t, tx.Commit(ctx))
	return added, nil
}

func succeededOutcome(event, key, ref string) engine.Outcome {
	return engine.Outcome{EventID: event, Record: reconcile.Record{Key: key, Reference: ref, Amount: 1, Status: reconcile.Succeeded}}
}

// TestRecordOutcome: the provider's word counts whenever it arrives, once per
// event, and a failure only when the lookup does not contradict it.
func TestRecordOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SucceededWhileWaiting", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		// A lookup that never answers: only the event settles it.
		down := errTimeout
		p.lookupErr.Store(&down)
		op := eventOp(t, p, "pending_event", time.Hour, 3)
		e, pool := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		key := waiting.Steps[1].DerivedKey
		for i, want := range []bool{true, false} { // delivered twice: kept once
			added, err := recordOutcome(t, e, pool, succeededOutcome("evt_1", key, "event"))
			require.NoError(t, err)
			require.Equal(t, want, added, "delivery %d", i+1)
		}
		other := succeededOutcome("evt_1", key, "another")
		other.Record.Amount = 2
		_, err := recordOutcome(t, e, pool, other)
		require.ErrorAs(t, err, new(*engine.ReusedError))
		var reused *engine.ReusedError
		require.ErrorAs(t, err, &reused)
		require.Equal(t, []string{"amount", "reference"}, reused.Fields)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.Equal(t, "event", out)
		require.Equal(t, engine.ResolvedByEvent, fsGet(t, e, s.ID).Steps[1].ResolvedBy)
		require.Equal(t, int32(1), p.calls.Load())
		require.Zero(t, p.undos.Load())
	})

	t.Run("EarlySuccessBeatsALaggingLookup", func(t *testing.T) {
		t.Parallel()
		// The call is made and the provider's event arrives while it is
		// still on its way (before the step waits); the caller hears
		// nothing, and the lookup finds nothing, past the window.
		p := newLateProvider(func(int32) string { return "timeout" })
		op := eventOp(t, p, "early_event", 100*time.Millisecond, 1)
		e, pool := lateEngine(t, op)
		p.onCall = func(key string) {
			added, err := recordOutcome(t, e, pool, succeededOutcome("evt_early", key, "pr_early"))
			require.NoError(t, err)
			require.True(t, added)
		}
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.Equal(t, "pr_early", out)
		require.Zero(t, p.undos.Load(), "nothing undone against the provider's word")
		require.Equal(t, engine.ResolvedByEvent, fsGet(t, e, s.ID).Steps[1].ResolvedBy)
	})

	t.Run("MismatchedSuccessParks", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(int32) string { return "timeout" })
		op := eventOp(t, p, "wrong_event", time.Hour, 1)
		e, pool := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		o := succeededOutcome("evt_wrong", waiting.Steps[1].DerivedKey, "pr_wrong")
		o.Record.Amount = 2
		_, err := recordOutcome(t, e, pool, o)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "parked", func(i *engine.Info) bool { return i.Parked })
		require.NotNil(t, info.Attention)
		require.EqualValues(t, engine.CodeReconciliationMismatch, info.Attention.Code)
		require.Zero(t, p.undos.Load())
	})

	t.Run("FailureContradictedByTheLookup", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		op := eventOp(t, p, "failure_contradicted", time.Hour, 3)
		e, pool := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		key := waiting.Steps[1].DerivedKey
		seen := p.lookups.Load()
		_, err := recordOutcome(t, e, pool, engine.Outcome{EventID: "evt_failed",
			Record:  reconcile.Record{Key: key, Status: reconcile.Failed},
			Failure: engine.Fail("payment_failed", "the provider failed the payment")})
		require.NoError(t, err)
		// The lookup, asked after the event, still says pending: it waits.
		require.Eventually(t, func() bool { return p.lookups.Load() > seen+1 }, fsTimeout, 10*time.Millisecond)
		require.Equal(t, engine.StatusInProgress, fsGet(t, e, s.ID).Status)
		// The provider pays after all.
		p.settle(key, true)
		require.Equal(t, engine.StatusSucceeded, fsWait(t, e, s.ID).Status)
		require.Zero(t, p.undos.Load())
	})

	t.Run("FailureNotContradicted", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		op := eventOp(t, p, "failure_event", time.Hour, 3)
		e, pool := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		key := waiting.Steps[1].DerivedKey
		p.mu.Lock()
		delete(p.pending, key) // the lookup finds nothing under the key
		p.mu.Unlock()
		_, err := recordOutcome(t, e, pool, engine.Outcome{EventID: "evt_failed",
			Record:  reconcile.Record{Key: key, Status: reconcile.Failed},
			Failure: engine.Fail("payment_failed", "the provider failed the payment")})
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "payment_failed", info.Error.Code)
		require.Equal(t, int32(1), p.undos.Load())
	})

	t.Run("NoNotMadeWhileASuccessIsKept", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(int32) string { return "timeout" })
		op := eventOp(t, p, "cancel_event", 100*time.Millisecond, 1)
		e, pool := lateEngine(t, op)
		down := errTimeout
		p.lookupErr.Store(&down)
		s, waiting := startWaiting(t, e, op)
		hold := make(chan struct{})
		p.hold.Store(&hold) // no run settles it meanwhile
		_, err := recordOutcome(t, e, pool, succeededOutcome("evt_c", waiting.Steps[1].DerivedKey, "pr_c"))
		require.NoError(t, err)
		var cancelErr error
		require.Eventually(t, func() bool {
			_, cancelErr = e.Cancel(ctx, s.ID, "")
			return cancelErr != nil && !errors.Is(cancelErr, engine.ErrRunning)
		}, fsTimeout, 10*time.Millisecond)
		// Refused past the point of no return, or, when the run woken by the
		// event applied it first (nothing holds a run that needs no lookup),
		// refused as finished: never compensated.
		require.True(t, errors.Is(cancelErr, engine.ErrPastPivot) || errors.Is(cancelErr, engine.ErrFinished), "%v", cancelErr)
		_, err = e.Resolve(ctx, s.ID, engine.Resolution{Made: false, Reason: "ops"})
		require.Error(t, err)
		p.hold.Store(nil)
		close(hold)
		require.Equal(t, engine.StatusSucceeded, fsWait(t, e, s.ID).Status)
		require.Zero(t, p.undos.Load())
	})

	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		down := errTimeout
		p.lookupErr.Store(&down)
		op := eventOp(t, p, "outcome_retention", time.Hour, 3)
		e, pool := lateEngine(t, op)
		_, waiting := startWaiting(t, e, op)
		// Held until the end: the waiting step does not read it meanwhile.
		hold := make(chan struct{})
		p.hold.Store(&hold)
		t.Cleanup(func() { close(hold) })
		_, err := recordOutcome(t, e, pool, engine.Outcome{EventID: "evt_pending",
			Record: reconcile.Record{Key: waiting.Steps[1].DerivedKey, Status: reconcile.Pending}})
		require.NoError(t, err)
		_, err = recordOutcome(t, e, pool, succeededOutcome("evt_stray", "a key no step holds", "pr_stray"))
		require.NoError(t, err)
		later := time.Now().Add(defaultRetention + time.Hour)
		_, err = e.DeleteFinished(ctx, &later)
		require.NoError(t, err)
		var keys []string
		rows, err := pool.Query(ctx, "SELECT derived_key FROM idemflow_outcome ORDER BY derived_key")
		require.NoError(t, err)
		for rows.Next() {
			var k string
			require.NoError(t, rows.Scan(&k))
			keys = append(keys, k)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{waiting.Steps[1].DerivedKey}, keys, "only the waiting step's outcome is kept past retention")
	})

	t.Run("AnotherReferenceIsNotTheStepsOutcome", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(n int32) string {
			if n == 1 {
				return "pending-ref"
			}
			return ""
		})
		op := eventOp(t, p, "other_reference", time.Hour, 3)
		e, pool := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		key := waiting.Steps[1].DerivedKey
		require.Equal(t, "ref:"+key[:8], waiting.Steps[1].Reference, "the pending call's reference is kept")
		_, err := recordOutcome(t, e, pool, succeededOutcome("evt_other", key, "someone else's"))
		require.NoError(t, err)
		list, err := e.MismatchList(ctx, nil)
		require.NoError(t, err)
		require.Len(t, list.Mismatches, 1)
		require.Equal(t, reconcile.ReferenceDiffers, list.Mismatches[0].Kind)
		require.Equal(t, s.ID, list.Mismatches[0].OperationID)
		// The step's own outcome, under the pending call's reference, counts.
		_, err = recordOutcome(t, e, pool, succeededOutcome("evt_own", key, "ref:"+key[:8]))
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.Equal(t, "ref:"+key[:8], out)
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		op := eventOp(t, p, "bad_outcome", time.Hour, 3)
		e, pool := lateEngine(t, op)
		for name, o := range map[string]engine.Outcome{
			"NoEventID":         {Record: reconcile.Record{Key: "k"}},
			"NoKey":             {EventID: "e"},
			"FailedWithoutCode": {EventID: "e", Record: reconcile.Record{Key: "k", Status: reconcile.Failed}},
			"UnknownStatus":     {EventID: "e", Record: reconcile.Record{Key: "k", Status: "maybe"}},
		} {
			_, err := recordOutcome(t, e, pool, o)
			require.Error(t, err, name)
		}
	})
}
