package engine_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// recorder is an Observer that writes down what it is told.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fmt.Sprintf(format, args...))
}

func (r *recorder) observer() *engine.Observer {
	return &engine.Observer{
		OperationStarted: func(_ context.Context, op engine.OperationEvent) { r.add("started %s/%d", op.Name, op.Version) },
		OperationFinished: func(_ context.Context, op engine.OperationEvent, s engine.Status) {
			r.add("finished %s %s", op.Name, s)
		},
		OperationRecovered: func(_ context.Context, op engine.OperationEvent) { r.add("recovered %s", op.Name) },
		StepAttempted: func(_ context.Context, s engine.StepEvent) {
			if s.Duration < 0 {
				panic("negative duration")
			}
			r.add("step %s %s #%d %s", s.Operation.Name, s.Step, s.Attempt, s.Outcome)
		},
		LookedUp: func(_ context.Context, s engine.StepEvent, found bool) {
			r.add("lookup %s %s #%d %t", s.Operation.Name, s.Step, s.Attempt, found)
		},
	}
}

func (r *recorder) sorted() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]string(nil), r.events...)
	sort.Strings(out)
	return out
}

// TestObserver: what the observer is told for known traffic.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var calls atomic.Int32
	tx := func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }
	op, err := engine.NewOperation("obs", []engine.Step[int, int]{
		engine.TxStep("a", tx),
		engine.ExternalStep("b", func(_ context.Context, _ engine.Attempt, in int, _ *int) error {
			switch {
			case in == 2:
				return engine.Fail("no", "refused")
			case in == 3 && calls.Add(1) == 1:
				return errors.New("lost answer")
			case in == 4:
				panic("boom")
			}
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return false, nil }).Window(0).
			Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	rec := &recorder{}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: rec.observer()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })

	for in := 1; in <= 4; in++ {
		s, err := engine.Start(ctx, e, op, "c", fmt.Sprint("k", in), in, nil)
		require.NoError(t, err)
		_, err = s.Wait(ctx)
		require.NoError(t, err)
	}
	// A replay is not a start.
	_, err = engine.Start(ctx, e, op, "c", "k1", 1, nil)
	require.NoError(t, err)

	// A run tells the observer that it finished just after its waiters hear
	// of it (from the row, or from the run that ends).
	requireEvents(t, rec, []string{
		"finished obs failed",    // 2: refused
		"finished obs failed",    // 4: panicked twice, then no lookup found it
		"finished obs succeeded", // 1
		"finished obs succeeded", // 3
		"lookup obs b #2 false",  // 3's second attempt asks first
		"lookup obs b #2 false",  // 4's second attempt
		"lookup obs b #2 false",  // 4, out of attempts: asked before compensating
		"started obs/1", "started obs/1", "started obs/1", "started obs/1",
		"step obs a #1 succeeded", "step obs a #1 succeeded", "step obs a #1 succeeded", "step obs a #1 succeeded",
		"step obs b #1 failed",    // 2
		"step obs b #1 panicked",  // 4
		"step obs b #1 retried",   // 3
		"step obs b #1 succeeded", // 1
		"step obs b #2 panicked",  // 4
		"step obs b #2 succeeded", // 3
	})

	// A recovery: an operation abandoned by another engine, taken over here.
	v := &versioned{runs: map[uuid.UUID][]string{}}
	abandoned := v.op(t, 1, "a", "b")
	id := startAndAbandon(t, pool, abandoned, "k-abandoned", "b")
	rec2 := &recorder{}
	e2, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{abandoned}, Lease: time.Second,
		SweepInterval: 20 * time.Millisecond, Observer: rec2.observer()})
	require.NoError(t, err)
	require.NoError(t, e2.StartWorkers(ctx))
	t.Cleanup(func() { _ = e2.Stop(context.Background()) })
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = e2.Wait(waitCtx, id)
	require.NoError(t, err)
	requireEvents(t, rec2, []string{"finished ver succeeded", "recovered ver", "step ver b #1 succeeded"})

	stats, err := e.InProgress(ctx)
	require.NoError(t, err)
	require.Empty(t, stats, "nothing is in progress")
}

// TestObserverPending: a call answered Pending is counted as its own outcome,
// AttemptAccepted, never AttemptRetried: the step waits for its outcome, it did not
// fail. The lookup that finds it made ends the wait.
func TestObserverPending(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	var calls atomic.Int32
	op, err := engine.NewOperation("pend", []engine.Step[int, int]{
		engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error {
			calls.Add(1)
			return engine.Accepted("", "accepted; final status later")
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) { return true, nil }).Window(time.Hour),
	}, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, Cap: 20 * time.Millisecond, MaxAttempts: 3}})
	require.NoError(t, err)
	rec := &recorder{}
	e := idemflowtest.Engine(t, pool, &engine.Config{Observer: rec.observer()}, op)
	fsHurry(t, pool)
	s, err := engine.Start(context.Background(), e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, fsWait(t, e, s.ID).Status)
	require.Equal(t, int32(1), calls.Load(), "a pending call is not made again")
	// A loaded machine may let the waiting operation's lease run out before
	// its job is taken: then the sweeper's resume recovers it, which is no
	// step attempt and not what this test is about.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		got := rec.sorted()
		got = slices.DeleteFunc(got, func(ev string) bool { return ev == "recovered pend" })
		assert.Equal(c, []string{
			"finished pend succeeded",
			"lookup pend call #1 true",
			"started pend/1",
			"step pend call #1 pending",
			"step pend call #1 succeeded", // found by the lookup
		}, got)
	}, 10*time.Second, 5*time.Millisecond)
}

// TestObserverFinishedBeforeWait: a first attempt tells the observer that it
// finished before Started.Wait returns, so that a count read after an answer
// includes it.
func TestObserverFinishedBeforeWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	op, err := engine.NewOperation("counted", []engine.Step[int, int]{
		engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	var finished atomic.Int64
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: &engine.Observer{
		// A slow observer: Wait returns only once it is done.
		OperationFinished: func(context.Context, engine.OperationEvent, engine.Status) {
			time.Sleep(5 * time.Millisecond)
			finished.Add(1)
		},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	for i := range 20 {
		s, err := engine.Start(ctx, e, op, "c", fmt.Sprint("k", i), i, nil)
		require.NoError(t, err)
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.EqualValues(t, i+1, finished.Load(), "operation %d counted when Wait returned", i)
	}
}

// requireEvents waits until what rec has written down, sorted, is want.
func requireEvents(t *testing.T, rec *recorder, want []string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, want, rec.sorted())
	}, 10*time.Second, 5*time.Millisecond)
}

type spanKey struct{}

// TestObserverContexts: a run's and a step attempt's contexts, as RunStarted
// and StepStarted return them, reach the step's function and the observer's
// later calls; Observers tells each of several.
func TestObserverContexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var seen []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); seen = append(seen, s); mu.Unlock() }
	op, err := engine.NewOperation("ctx", []engine.Step[int, int]{
		engine.ExternalStep("call", func(ctx context.Context, _ engine.Attempt, _ int, _ *int) error {
			note(fmt.Sprint("step sees ", ctx.Value(spanKey{})))
			return nil
		}),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	tracer := &engine.Observer{
		RunStarted: func(ctx context.Context, op engine.OperationEvent, resumed bool) context.Context {
			return context.WithValue(ctx, spanKey{}, "run:"+op.Name)
		},
		StepStarted: func(ctx context.Context, s engine.StepEvent) context.Context {
			return context.WithValue(ctx, spanKey{}, fmt.Sprint(ctx.Value(spanKey{}), "/step:", s.Step))
		},
		StepAttempted: func(ctx context.Context, s engine.StepEvent) {
			note(fmt.Sprint("attempt ends in ", ctx.Value(spanKey{})))
		},
		RunEnded: func(ctx context.Context, op engine.OperationEvent, end engine.RunEnd, err error) {
			note(fmt.Sprint("run ends in ", ctx.Value(spanKey{}), " ", end, " err=", err))
		},
	}
	rec := &recorder{}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: engine.Observers(tracer, nil, rec.observer())})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	_, err = s.Wait(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) == 3 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, []string{"step sees run:ctx/step:call", "attempt ends in run:ctx/step:call", "run ends in run:ctx finished err=<nil>"}, seen)
	require.Contains(t, rec.sorted(), "step ctx call #1 succeeded", "the second observer is told too")
}

// TestObserverPanics: an observer that panics in every call changes nothing of
// the run: the operation succeeds, and the process lives.
func TestObserverPanics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	op, err := engine.NewOperation("panicky", []engine.Step[int, int]{
		engine.TxStep("a", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
		engine.ExternalStep("b", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	boom := func() { panic("observer bug") }
	obs := &engine.Observer{
		OperationStarted:   func(context.Context, engine.OperationEvent) { boom() },
		OperationFinished:  func(context.Context, engine.OperationEvent, engine.Status) { boom() },
		OperationRecovered: func(context.Context, engine.OperationEvent) { boom() },
		StepAttempted:      func(context.Context, engine.StepEvent) { boom() },
		LookedUp:           func(context.Context, engine.StepEvent, bool) { boom() },
		RunStarted:         func(context.Context, engine.OperationEvent, bool) context.Context { panic("observer bug") },
		RunEnded:           func(context.Context, engine.OperationEvent, engine.RunEnd, error) { boom() },
		StepStarted:        func(context.Context, engine.StepEvent) context.Context { panic("observer bug") },
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: obs})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	s, err := engine.Start(ctx, e, op, "c", "k", 3, nil)
	require.NoError(t, err)
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
}

// TestObserverStartTx: an operation reserved in the caller's transaction is
// counted as started once, when its River job first runs it, and that first
// run calls its external step without asking the lookup (nothing can have
// been sent before it).
func TestObserverStartTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var lookups, calls atomic.Int32
	op, err := engine.NewOperation("queued", []engine.Step[int, int]{
		engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error {
			calls.Add(1)
			return nil
		}).Lookup(func(context.Context, engine.Attempt, int, *int) (bool, error) {
			lookups.Add(1)
			return false, nil
		}),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	var started, finished atomic.Int32
	var resumed atomic.Bool
	obs := &engine.Observer{
		OperationStarted:  func(context.Context, engine.OperationEvent) { started.Add(1) },
		OperationFinished: func(context.Context, engine.OperationEvent, engine.Status) { finished.Add(1) },
		RunStarted: func(ctx context.Context, _ engine.OperationEvent, r bool) context.Context {
			resumed.Store(resumed.Load() || r)
			return ctx
		},
	}
	pool := testdb.Pool(t)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: obs, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	s, err := engine.StartTx(ctx, tx, e, op, "queue", "m-1", 7, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	info := waitDone(t, e, s)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Equal(t, int32(1), started.Load(), "started once, by its first run")
	require.Equal(t, int32(1), finished.Load())
	require.Equal(t, int32(1), calls.Load())
	require.Zero(t, lookups.Load(), "a first run has nothing to look up")
	require.False(t, resumed.Load(), "its first run is no resume")

	// Rolled back: nothing started.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = engine.StartTx(ctx, tx, e, op, "queue", "m-2", 7, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, int32(1), started.Load())
}
