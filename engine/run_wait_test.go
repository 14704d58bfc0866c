package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// lateProvider is an outside service whose requests may land after their
// caller gave up, or be accepted as pending and settled later: what the
// outcome tests call. Its refunds are by idempotency key.
type lateProvider struct {
	mu sync.Mutex
	// made are the calls carried out, by key; pending those accepted and
	// not settled; failed those settled as failed.
	made    map[string]bool
	pending map[string]bool
	failed  map[string]bool
	calls   atomic.Int32
	lookups atomic.Int32
	undos   atomic.Int32
	// callFunc decides each call (by its number from 1): "timeout" (the
	// request is not carried out, the caller hears nothing), "late" (the
	// caller hears nothing, the request lands later by land), "pending", or
	// "" (made at once).
	callFunc func(n int32) string
	// lookupErr, when set, is what the lookup answers instead.
	lookupErr atomic.Pointer[error]
	// hold, when set, holds every lookup until it is closed; held counts
	// the lookups it holds.
	hold atomic.Pointer[chan struct{}]
	held atomic.Int32
	// onCall, when set, runs in every call, with its key, before it answers.
	onCall func(key string)
}

func newLateProvider(callFunc func(n int32) string) *lateProvider {
	return &lateProvider{made: map[string]bool{}, pending: map[string]bool{}, failed: map[string]bool{}, callFunc: callFunc}
}

var errTimeout = errors.New("provider: timeout")

func (p *lateProvider) call(ctx context.Context, at engine.Attempt, _ int, s *lateState) error {
	n := p.calls.Add(1)
	if p.onCall != nil {
		p.onCall(at.Key)
	}
	what := p.callFunc(n)
	if what == "hang" { // sent, and no answer until the caller gives up
		<-ctx.Done()
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch what {
	case "timeout":
		return errTimeout
	case "late":
		go func() {
			// The request lands after the caller gave up on it: the delay is
			// the behaviour under test, not a wait.
			time.Sleep(150 * time.Millisecond)
			p.land(at.Key)
		}()
		return errTimeout
	case "pending":
		p.pending[at.Key] = true
		return engine.Accepted("", "accepted; final status later")
	case "pending-ref":
		p.pending[at.Key] = true
		return engine.Accepted("ref:"+at.Key[:8], "accepted under a reference; final status later")
	}
	p.made[at.Key] = true
	s.Ref = "made:" + at.Key[:8]
	return nil
}

// pendingOnce answers the first call pending, and makes every later one.
func pendingOnce(n int32) string {
	if n == 1 {
		return "pending"
	}
	return ""
}

// land carries out a request that arrived earlier.
func (p *lateProvider) land(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.made[key] = true
}

// settle ends a pending call, made or failed.
func (p *lateProvider) settle(key string, made bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pending, key)
	if made {
		p.made[key] = true
	} else {
		p.failed[key] = true
	}
}

func (p *lateProvider) lookup(ctx context.Context, at engine.Attempt, _ int, s *lateState) (bool, error) {
	p.lookups.Add(1)
	if hold := p.hold.Load(); hold != nil {
		p.held.Add(1)
		select {
		case <-*hold:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if err := p.lookupErr.Load(); err != nil {
		return false, *err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pending[at.Key]:
		return false, engine.Accepted("", "still pending")
	case p.failed[at.Key]:
		return false, engine.Fail("payment_failed", "the provider failed the payment")
	case p.made[at.Key]:
		s.Ref = "made:" + at.Key[:8]
		return true, nil
	}
	return false, nil
}

type lateState struct {
	Ref string `json:"ref"`
}

// lateOp is an operation of a compensatable transactional step, then the
// provider's call (a pivot) with the given outcome window.
func lateOp(t *testing.T, p *lateProvider, name string, settle time.Duration, attempts int) *engine.Operation[int, lateState, string] {
	t.Helper()
	return lateOpWith(t, p, name, attempts, func(pay engine.ExternalStepDef[int, lateState]) engine.ExternalStepDef[int, lateState] {
		return pay.Window(settle)
	})
}

// lateOpWith is lateOp whose pay step (its call and lookup) is made what
// payFunc returns.
func lateOpWith(t *testing.T, p *lateProvider, name string, attempts int,
	payFunc func(engine.ExternalStepDef[int, lateState]) engine.ExternalStepDef[int, lateState]) *engine.Operation[int, lateState, string] {
	t.Helper()
	noop := func(context.Context, engine.Tx, engine.Attempt, int, *lateState) error { return nil }
	op, err := engine.NewOperation(name, []engine.Step[int, lateState]{
		engine.TxStep("hold", noop).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *lateState) error {
			p.undos.Add(1)
			return nil
		}),
		payFunc(engine.ExternalStep("pay", p.call).Lookup(p.lookup)),
	}, func(_ int, s *lateState) (string, error) { return s.Ref, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: attempts}})
	require.NoError(t, err)
	return op
}

func lateEngine(t *testing.T, op engine.Definition) (*engine.Engine, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.Pool(t)
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	fsHurry(t, pool)
	return e, pool
}

// startWaiting starts op and waits until its pay step waits for its outcome.
func startWaiting(t *testing.T, e *engine.Engine, op *engine.Operation[int, lateState, string]) (*engine.Started, *engine.Info) {
	t.Helper()
	s, err := engine.Start(context.Background(), e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	return s, fsAwait(t, e, s.ID, "the step waits", func(i *engine.Info) bool {
		return i.Steps[1].Status == engine.StepStatusWaiting
	})
}

// TestUnknownOutcome: an external step out of attempts whose calls got no
// answer calls no more and waits for its outcome window; what its lookup finds
// decides, and "nothing" only once the window has passed.
func TestUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("LateLandingGoesForward", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(int32) string { return "late" })
		op := lateOp(t, p, "late_landing", 10*time.Second, 2)
		e, _ := lateEngine(t, op)
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, int32(2), p.calls.Load(), "MaxAttempts bounds the calls")
		require.Zero(t, p.undos.Load(), "nothing was undone on a guess")
		pay := fsGet(t, e, s.ID).Steps[1]
		require.Equal(t, engine.ResolvedByLookup, pay.ResolvedBy)
		require.Equal(t, 2, pay.Attempts)
	})

	t.Run("NothingFoundFailsAfterTheWindow", func(t *testing.T) {
		t.Parallel()
		const settle = 700 * time.Millisecond
		p := newLateProvider(func(int32) string { return "timeout" })
		op := lateOp(t, p, "never_landed", settle, 2)
		e, _ := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		require.Equal(t, engine.StatusInProgress, waiting.Status)
		require.False(t, waiting.Steps[1].Accepted)
		require.NotNil(t, waiting.Steps[1].SentAt)
		require.NotNil(t, waiting.Steps[1].WaitingSince)
		require.Zero(t, p.undos.Load())

		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
		require.True(t, info.Error.ServerFault())
		require.False(t, info.FinishedAt.Before(waiting.Steps[1].SentAt.Add(settle)),
			"failed at %s, before the window's end %s", info.FinishedAt, waiting.Steps[1].SentAt.Add(settle))
		require.Equal(t, int32(1), p.undos.Load())
		require.Equal(t, int32(2), p.calls.Load())
	})

	t.Run("FailingLookupNeitherCallsNorGivesUp", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(int32) string { return "timeout" })
		lookupDown := errors.New("provider: lookup unavailable")
		p.lookupErr.Store(&lookupDown)
		op := lateOp(t, p, "lookup_down", 200*time.Millisecond, 3)
		e, _ := lateEngine(t, op)
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		overdue := fsAwait(t, e, s.ID, "it needs attention past its window", func(i *engine.Info) bool {
			return i.NeedsAttention()
		})
		require.EqualValues(t, engine.CodeOutcomeOverdue, overdue.Attention.Code)
		require.Equal(t, engine.StepStatusWaiting, overdue.Steps[1].Status)
		// (An attempt after the first asks the lookup first, which fails: it
		// sends nothing either.)
		calls, seen := p.calls.Load(), p.lookups.Load()
		require.LessOrEqual(t, calls, int32(3))
		require.Eventually(t, func() bool { return p.lookups.Load() > seen+2 }, fsTimeout, 10*time.Millisecond, "the lookup is asked again")
		require.Equal(t, calls, p.calls.Load(), "out of attempts, the step sends nothing more")
		require.Zero(t, p.undos.Load())
		// An operator's retry runs it again at once: a lookup, no call.
		seen = p.lookups.Load()
		require.Eventually(t, func() bool { return !errors.Is(errOf(e.Retry(ctx, s.ID, nil)), engine.ErrRunning) }, fsTimeout, 5*time.Millisecond)
		require.Eventually(t, func() bool { return p.lookups.Load() > seen }, fsTimeout, 5*time.Millisecond)
		require.Equal(t, calls, p.calls.Load())

		// The provider answers again: the call had landed.
		p.land(fsGet(t, e, s.ID).Steps[1].DerivedKey)
		p.lookupErr.Store(nil)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, calls, p.calls.Load())
		require.Zero(t, p.undos.Load())
	})

	t.Run("CancelAfterARunStoppedMidCall", func(t *testing.T) {
		t.Parallel()
		const settle = time.Hour
		p := newLateProvider(func(int32) string { return "hang" })
		op := lateOp(t, p, "cancel_mid_call", settle, 3)
		pool := testdb.Pool(t)
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		require.Eventually(t, func() bool { return p.calls.Load() == 1 }, fsTimeout, time.Millisecond)
		stopCtx, stop := context.WithTimeout(ctx, 100*time.Millisecond)
		defer stop()
		_ = e.Stop(stopCtx) // the call is cut: its request may still land
		stopped := time.Now()

		other := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		_, err = other.Cancel(ctx, s.ID, "customer gave up")
		var ou *engine.RefusedError
		require.ErrorAs(t, err, &ou)
		require.WithinDuration(t, stopped.Add(settle), ou.KnownAt, 5*time.Second)
		require.Zero(t, p.undos.Load())
		require.Equal(t, engine.StatusInProgress, fsGet(t, other, s.ID).Status)
	})

	t.Run("CancelWaitsForTheWindow", func(t *testing.T) {
		t.Parallel()
		const settle = time.Hour
		p := newLateProvider(func(int32) string { return "timeout" })
		op := lateOp(t, p, "cancel_unknown", settle, 1)
		e, _ := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		var cancelErr error
		require.Eventually(t, func() bool {
			_, cancelErr = e.Cancel(ctx, s.ID, "customer gave up")
			return !errors.Is(cancelErr, engine.ErrRunning)
		}, fsTimeout, 10*time.Millisecond)
		require.ErrorIs(t, cancelErr, engine.ErrOutcomeUnknown)
		var ou *engine.RefusedError
		require.ErrorAs(t, cancelErr, &ou)
		require.Equal(t, "pay", ou.Step)
		require.WithinDuration(t, waiting.Steps[1].SentAt.Add(settle), ou.KnownAt, time.Second)
		require.Zero(t, p.undos.Load())
		require.Equal(t, engine.StatusInProgress, fsGet(t, e, s.ID).Status)
	})
}

// TestPendingOutcome: a call accepted as pending waits, with no run holding
// it, for its lookup, an event or a failure; the pivot is the provider's
// success, not its acceptance.
func TestPendingOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SettledByLookup", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		op := lateOp(t, p, "pending_lookup", time.Hour, 3)
		e, _ := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		require.True(t, waiting.Steps[1].Accepted)
		require.False(t, waiting.NeedsAttention())
		seen := p.lookups.Load()
		require.Eventually(t, func() bool { return p.lookups.Load() > seen+1 }, fsTimeout, 10*time.Millisecond)
		p.settle(waiting.Steps[1].DerivedKey, true)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, int32(1), p.calls.Load(), "a pending call is not made again")
		require.Equal(t, engine.ResolvedByLookup, fsGet(t, e, s.ID).Steps[1].ResolvedBy)
	})

	t.Run("FailedByLookup", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(pendingOnce)
		op := lateOp(t, p, "pending_failed", time.Hour, 3)
		e, _ := lateEngine(t, op)
		s, waiting := startWaiting(t, e, op)
		var cancelErr error
		require.Eventually(t, func() bool {
			_, cancelErr = e.Cancel(ctx, s.ID, "")
			return !errors.Is(cancelErr, engine.ErrRunning)
		}, fsTimeout, 10*time.Millisecond)
		var ou *engine.RefusedError
		require.ErrorAs(t, cancelErr, &ou)
		require.True(t, ou.Accepted)

		p.settle(waiting.Steps[1].DerivedKey, false)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "payment_failed", info.Error.Code)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, int32(1), p.undos.Load())
		require.Equal(t, engine.StepStatusFailed, fsGet(t, e, s.ID).Steps[1].Status)
	})

}

// TestToldAnswersFinal: Retry refuses what the client was told (a business
// answer, a cancel), and reopens a server fault only when forced, whose
// answer stays visible until the operation finishes again.
func TestToldAnswersFinal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var fail atomic.Pointer[error]
	noop := func(context.Context, engine.Tx, engine.Attempt, string, *struct{}) error { return nil }
	op, err := engine.NewOperation("told", []engine.Step[string, struct{}]{
		engine.TxStep("a", noop),
		engine.TxStep("b", func(context.Context, engine.Tx, engine.Attempt, string, *struct{}) error {
			if err := fail.Load(); err != nil {
				return *err
			}
			return nil
		}),
	}, func(in string, _ *struct{}) (string, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 1}})
	require.NoError(t, err)
	pool := testdb.Pool(t)
	// No workers yet: a reopened operation waits in the database, to be read.
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
	fsHurry(t, pool)

	business := error(engine.Fail("declined", "declined"))
	fail.Store(&business)
	s, err := engine.Start(ctx, e, op, "c", "business", "x", nil)
	require.NoError(t, err)
	require.EqualValues(t, "declined", fsWait(t, e, s.ID).Error.Code)
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrFinal)
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true})), engine.ErrFinal)

	transient := errors.New("flaky")
	fail.Store(&transient)
	s, err = engine.Start(ctx, e, op, "c", "fault", "x", nil)
	require.NoError(t, err)
	failed := fsWait(t, e, s.ID)
	require.True(t, failed.Error.ServerFault())
	require.ErrorIs(t, errOf(e.Retry(ctx, s.ID, nil)), engine.ErrFinal)
	require.Equal(t, engine.StatusFailed, fsGet(t, e, s.ID).Status, "a refused retry changes nothing")

	// Forced: the reopened operation shows the answer its client was told
	// until it finishes again.
	fail.Store(nil)
	require.NoError(t, errOf(e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true})))
	reopened := fsGet(t, e, s.ID)
	require.Equal(t, engine.StatusInProgress, reopened.Status)
	require.NotNil(t, reopened.PriorError)
	require.EqualValues(t, failed.Error.Code, reopened.PriorError.Code)
	require.NoError(t, e.StartWorkers(ctx))
	done := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.Nil(t, fsGet(t, e, s.ID).PriorError)
}

// TestDatabaseTroubleIsNotTheStepsFault: a transactional step whose statements
// time out on a lock is retried without using up its attempts.
func TestDatabaseTroubleIsNotTheStepsFault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE dbt_row (id int PRIMARY KEY, n int NOT NULL); INSERT INTO dbt_row VALUES (1, 0)`)
	require.NoError(t, err)
	var tries atomic.Int32
	op, err := engine.NewOperation("dbt", []engine.Step[int, struct{}]{
		engine.TxStep("bump", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *struct{}) error {
			tries.Add(1)
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '20ms'`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE dbt_row SET n = n + 1 WHERE id = 1`)
			return err
		}),
	}, func(int, *struct{}) (int, error) { return 0, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	fsHurry(t, pool)

	// Hold the row's lock while the step tries more often than it may fail.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT 1 FROM dbt_row WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)
	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	held := fsAwait(t, e, s.ID, "it failed for want of the lock", func(i *engine.Info) bool {
		return i.Steps[0].LastError != ""
	})
	require.Contains(t, held.Steps[0].LastError, "database")
	require.Eventually(t, func() bool { return tries.Load() > 4 }, fsTimeout, 5*time.Millisecond,
		"tried more often than MaxAttempts allows")
	require.Equal(t, engine.StatusInProgress, fsGet(t, e, s.ID).Status)
	require.NoError(t, holder.Rollback(ctx))

	info := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT n FROM dbt_row WHERE id = 1`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestResolve: an operator closes what waits past its window or is parked:
// "made" goes forward, "not made" compensates; the lookup, when it answers,
// must agree, and a refusal changes nothing.
func TestResolve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// waiting starts an operation whose pay step, out of attempts, waits past
	// its (short) outcome window, the lookup failing.
	waiting := func(t *testing.T, name string) (*lateProvider, *engine.Engine, *engine.Operation[int, lateState, string], *engine.Info) {
		p := newLateProvider(func(int32) string { return "timeout" })
		down := errors.New("provider: lookup unavailable")
		p.lookupErr.Store(&down)
		noop := func(context.Context, engine.Tx, engine.Attempt, int, *lateState) error { return nil }
		op, err := engine.NewOperation(name, []engine.Step[int, lateState]{
			engine.TxStep("hold", noop).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *lateState) error {
				p.undos.Add(1)
				return nil
			}),
			engine.ExternalStep("pay", p.call).Lookup(p.lookup).Window(100 * time.Millisecond).
				FromReference(func(_ int, s *lateState, ref string) error {
					if ref == "" {
						return errors.New("empty")
					}
					s.Ref = ref
					return nil
				}),
		}, func(_ int, s *lateState) (string, error) { return s.Ref, nil },
			&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 1}})
		require.NoError(t, err)
		e, _ := lateEngine(t, op)
		s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "waiting past its window", func(i *engine.Info) bool { return i.NeedsAttention() })
		return p, e, op, info
	}
	resolve := func(t *testing.T, e *engine.Engine, id uuid.UUID, res engine.Resolution) (*engine.Info, error) {
		var info *engine.Info
		var err error
		require.Eventually(t, func() bool {
			info, err = e.Resolve(ctx, id, res)
			return !errors.Is(err, engine.ErrRunning)
		}, fsTimeout, 5*time.Millisecond)
		return info, err
	}

	t.Run("MadeOnTheOperatorsWord", func(t *testing.T) {
		t.Parallel()
		p, e, _, info := waiting(t, "resolve_made")
		_, err := e.Resolve(ctx, info.ID, engine.Resolution{Made: true, Reference: "pay_1"})
		require.ErrorIs(t, err, engine.ErrInvalidResolution, "no reason")
		_, err = resolve(t, e, info.ID, engine.Resolution{Made: true, Reason: "the bank's statement shows it"})
		require.ErrorIs(t, err, engine.ErrInvalidResolution, "no reference")
		_, err = e.Resolve(engine.WithActor(ctx, "alice"), info.ID, engine.Resolution{Made: true, Reference: "pay_1", Reason: "the bank's statement shows it"})
		require.NoError(t, err)
		finished := fsWait(t, e, info.ID)
		require.Equal(t, engine.StatusSucceeded, finished.Status)
		got := fsGet(t, e, info.ID)
		require.Equal(t, engine.ResolvedByOperator, got.Steps[1].ResolvedBy)
		require.Zero(t, p.undos.Load())
		_, err = e.Resolve(ctx, info.ID, engine.Resolution{Made: true, Reference: "pay_1", Reason: "again"})
		require.ErrorIs(t, err, engine.ErrNotResolvable)

		// Every request is in the audit trail, done or refused, oldest first.
		audit := fsGet(t, e, info.ID).Audit
		var results []string
		for _, a := range audit {
			require.Equal(t, engine.ActionResolve, a.Action)
			results = append(results, a.Result)
		}
		// (A request refused while a run held the operation is in it too.)
		require.GreaterOrEqual(t, len(results), 4)
		require.Equal(t, "refused", results[0], "no reason")
		done := audit[len(audit)-2]
		require.Equal(t, "done", done.Result)
		require.Equal(t, "alice", done.Actor)
		require.Equal(t, "the bank's statement shows it", done.Reason)
		last := audit[len(audit)-1]
		require.Equal(t, "refused", last.Result)
		require.Equal(t, defaultActor, last.Actor)
		require.Contains(t, last.Detail, "not resolvable")
	})

	t.Run("ContradictedByTheLookup", func(t *testing.T) {
		t.Parallel()
		p, e, _, info := waiting(t, "resolve_contradicted")
		p.land(info.Steps[1].DerivedKey) // the call went through after all
		p.lookupErr.Store(nil)
		_, err := resolve(t, e, info.ID, engine.Resolution{Made: true, Reference: "someone else's", Reason: "x"})
		require.ErrorIs(t, err, engine.ErrResolutionContradicts, "another reference")
		_, err = resolve(t, e, info.ID, engine.Resolution{Made: false, Reason: "x"})
		require.ErrorIs(t, err, engine.ErrResolutionContradicts, "it was made")
		require.Zero(t, p.undos.Load())
		require.Equal(t, engine.StatusInProgress, fsGet(t, e, info.ID).Status, "refusals change nothing")
	})

	t.Run("NotMade", func(t *testing.T) {
		t.Parallel()
		p, e, op, info := waiting(t, "resolve_not_made")
		got, err := resolve(t, e, info.ID, engine.Resolution{Made: false, Reason: "the bank never got it"})
		require.NoError(t, err)
		if got.Status == engine.StatusInProgress {
			got = fsWait(t, e, info.ID)
		}
		require.Equal(t, engine.StatusFailed, got.Status)
		require.EqualValues(t, engine.CodeResolvedNotMade, got.Error.Code)
		require.True(t, got.Error.ServerFault())
		require.Equal(t, int32(1), p.undos.Load())
		_ = op
	})

	t.Run("NotMadeWithTheOperationsAnswer", func(t *testing.T) {
		t.Parallel()
		p, e, _, info := waiting(t, "resolve_not_charged")
		_, err := resolve(t, e, info.ID, engine.Resolution{Made: false, Reason: "x", Failure: &engine.PermanentError{Code: "not_charged"}})
		require.ErrorIs(t, err, engine.ErrInvalidResolution, "an answer needs a message")
		got, err := resolve(t, e, info.ID, engine.Resolution{Made: false, Reason: "the bank never got it",
			Failure: engine.Fail("not_charged", "nothing was charged")})
		require.NoError(t, err)
		if got.Status == engine.StatusInProgress {
			got = fsWait(t, e, info.ID)
		}
		require.Equal(t, engine.StatusFailed, got.Status)
		require.EqualValues(t, "not_charged", got.Error.Code)
		require.False(t, got.Error.ServerFault(), "the client is told the business answer")
		require.Equal(t, int32(1), p.undos.Load())
	})

	t.Run("NotResolvableWithinTheWindow", func(t *testing.T) {
		t.Parallel()
		p := newLateProvider(func(int32) string { return "timeout" })
		op := lateOp(t, p, "resolve_early", time.Hour, 1)
		e, _ := lateEngine(t, op)
		s, _ := startWaiting(t, e, op)
		_, err := resolve(t, e, s.ID, engine.Resolution{Made: false, Reason: "impatient"})
		require.ErrorIs(t, err, engine.ErrNotResolvable)
		require.Contains(t, err.Error(), "outcome window")
	})
}
