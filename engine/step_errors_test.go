package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

// TestPanicsContained: a panic in user code fails its attempt, wherever the
// engine calls it (a transactional step in a first run and in a resumed one, a
// lookup, a compensation, the result function); the attempt is counted and
// its texts say so, and the operation ends as the rules say.
func TestPanicsContained(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := fsIn{Account: "acct", Amount: 100}
	retry := engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 5}

	t.Run("TxStepFirstAttempt", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, bookFault: func(n int) error {
			if n == 1 {
				panic("kaboom-tx-first")
			}
			return nil
		}}
		op := f.op(t, "panic_tx")
		gate := newFSGate(fsAt("book", faults.PointBefore, 2))
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease, Faults: engine.Faults{Hook: gate.hook}}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		info := fsGet(t, e, s.ID)
		book := info.Steps[2]
		require.Equal(t, 1, book.Attempts, "the panicking attempt is counted")
		require.Equal(t, engine.StepStatusRunning, book.Status)
		require.True(t, strings.HasPrefix(book.LastError, "panic"), "LastError: %q", book.LastError)
		require.NotContains(t, book.LastError, "kaboom-tx-first")
		require.Contains(t, book.LastCause, "kaboom-tx-first")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, e, s.ID)
		require.Equal(t, 1, got.Runs, "the run that panicked retried the step itself")
		require.Equal(t, 2, got.Steps[2].Attempts)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("TxStepResumedAttempt", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, bookFault: func(n int) error {
			switch n {
			case 1:
				return errors.New("ledger busy")
			case 2:
				panic("kaboom-tx-resumed")
			}
			return nil
		}}
		op := f.op(t, "panic_resumed")
		var mu sync.Mutex
		var seen []string
		trace := func(_ context.Context, ev faults.Event) error {
			if ev.Step == "book" && ev.Point == faults.PointBefore {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%d resumed=%t", ev.Attempt, ev.Resumed))
				mu.Unlock()
			}
			return nil
		}
		gate := newFSGate(fsAt("book", faults.PointBefore, 3))
		// The backoff (5ms) is longer than InlineRetryMax: a River job runs each retry.
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease, InlineRetryMax: time.Millisecond, Faults: engine.Faults{Hook: fsHooks(trace, gate.hook)}}, op)
		fsHurry(t, pool)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		info := fsGet(t, e, s.ID)
		book := info.Steps[2]
		require.Equal(t, 2, book.Attempts)
		require.True(t, strings.HasPrefix(book.LastError, "panic"), "LastError: %q", book.LastError)
		require.Contains(t, book.LastCause, "kaboom-tx-resumed")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, e, s.ID)
		require.Equal(t, 3, got.Steps[2].Attempts)
		require.Equal(t, 3, got.Runs)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"1 resumed=false", "2 resumed=true", "3 resumed=true"}, seen,
			"each attempt once: the panic was an attempt of its own, in a resumed run")
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("Lookup", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(attempt int) (bool, error) {
				if attempt == 1 {
					return false, errors.New("provider unavailable")
				}
				return true, nil
			},
			lookupFault: func(attempt int) error {
				if attempt == 2 {
					panic("kaboom-lookup")
				}
				return nil
			},
		}
		op := f.op(t, "panic_lookup")
		gate := newFSGate(fsAt("pay", faults.PointBefore, 3))
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease, Faults: engine.Faults{Hook: gate.hook}}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		pay := fsGet(t, e, s.ID).Steps[1]
		require.Equal(t, 2, pay.Attempts, "the attempt whose lookup panicked is counted")
		require.True(t, strings.HasPrefix(pay.LastError, "panic"), "LastError: %q", pay.LastError)
		require.Contains(t, pay.LastCause, "kaboom-lookup")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:3:missing", "call:3"}, events, "no call after the lookup panicked")
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("LookupInCancel", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var panics atomic.Bool
		panics.Store(true)
		f := &fsFlow{pool: pool, lookup: true, lookupFault: func(int) error {
			if panics.Load() {
				panic("kaboom-cancel-lookup")
			}
			return nil
		}}
		op := f.op(t, "panic_cancel_lookup")
		id := fsCrashAt(t, pool, op, "pay", faults.PointBefore)
		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		_, err := b.Cancel(ctx, id, "customer withdrew")
		require.ErrorContains(t, err, "kaboom-cancel-lookup", "a lookup that cannot answer stops the cancel")
		info := fsGet(t, b, id)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Nil(t, info.Error)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		// Nothing was changed: it goes on once the lookup answers.
		panics.Store(false)
		require.NoError(t, b.StartWorkers(ctx))
		done := fsWait(t, b, id)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("Compensation", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(int) (bool, error) { return false, engine.Fail("declined", "the provider declined the payment") },
			undoFault: func(n int) error {
				if n == 1 {
					panic("kaboom-undo")
				}
				return nil
			},
		}
		op := f.op(t, "panic_undo")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
		fsHurry(t, pool)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, done.Status)
		require.EqualValues(t, "declined", done.Error.Code)
		require.Equal(t, int32(2), f.debitUndos.Load(), "the compensation that panicked is retried")
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool), "the panicking compensation's write rolled back")
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
	})

	t.Run("ResultBeforePivot", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, undoablePay: true, retry: retry,
			resultFault: func() error { panic("kaboom-result") }}
		op := f.op(t, "panic_result")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, done.Status)
		require.EqualValues(t, engine.CodeResultFailed, done.Error.Code)
		require.True(t, done.Error.ServerFault())
		require.Contains(t, done.Error.Cause, "kaboom-result")
		require.NotContains(t, done.Error.Message, "kaboom-result")
		require.Equal(t, int32(1), f.payUndos.Load())
		require.Equal(t, int32(1), f.debitUndos.Load())
		// book's writes rolled back with the result.
		require.Equal(t, fsBooks{debits: 1, reversals: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))
	})

	t.Run("ResultPastPivot", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var panics atomic.Bool
		panics.Store(true)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, resultFault: func() error {
			if panics.Load() {
				panic("kaboom-result-past-pivot")
			}
			return nil
		}}
		op := f.op(t, "panic_result_pivot")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "parked", fsParked)
		require.EqualValues(t, engine.CodeFailedPastPivot, info.Attention.Code)
		require.Contains(t, info.Attention.Reason, "kaboom-result-past-pivot")
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		panics.Store(false)
		require.NoError(t, errOf(e.Retry(ctx, s.ID, nil)), nil)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})
}

// TestClientFacingTexts: a failure whose error names SQL, a URL and a file
// keeps them from the client's texts (StepInfo.LastError, the operation's
// Error.Message) and gives them to operators (LastCause, Error.Cause).
func TestClientFacingTexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE fs_text (id int PRIMARY KEY); INSERT INTO fs_text VALUES (1)`)
	require.NoError(t, err)
	const insert = `INSERT INTO fs_text (id) VALUES (1)`
	op, err := engine.NewOperation("texts", []engine.Step[int, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, insert)
			return fmt.Errorf("POST http://10.0.0.1/x, config /etc/passwd: %s: %w", insert, err)
		}),
	}, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	gate := newFSGate(fsAt("write", faults.PointBefore, 2))
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease, Faults: engine.Faults{Hook: gate.hook}}, op)
	internals := []string{"duplicate key", "fs_text_pkey", "23505", insert, "http://10.0.0.1/x", "10.0.0.1", "/etc/passwd"}
	clean := func(t *testing.T, client, operator string) {
		t.Helper()
		require.NotEmpty(t, client)
		for _, s := range internals {
			require.NotContains(t, client, s, "the client's text names something internal")
			require.Contains(t, operator, s, "the operator's text lacks the cause")
		}
	}

	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	gate.wait(t)
	retrying := fsGet(t, e, s.ID).Steps[0]
	require.Equal(t, engine.StepStatusRunning, retrying.Status)
	clean(t, retrying.LastError, retrying.LastCause)

	gate.open()
	done := fsWaitStarted(t, s)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.EqualValues(t, engine.CodeAttemptsExhausted, done.Error.Code)
	require.True(t, done.Error.ServerFault())
	clean(t, done.Error.Message, done.Error.Cause)

	stored, err := e.GetByKey(ctx, "c", "k")
	require.NoError(t, err)
	require.EqualValues(t, engine.CodeAttemptsExhausted, stored.Error.Code)
	require.True(t, stored.Error.ServerFault())
	clean(t, stored.Error.Message, stored.Error.Cause)
	failed := fsGet(t, e, s.ID).Steps[0]
	require.Equal(t, engine.StepStatusFailed, failed.Status)
	require.Equal(t, 2, failed.Attempts)
	clean(t, failed.LastError, failed.LastCause)
}

// TestHaltParks: a step that returns engine.Halt parks its operation with the
// halt's code: not compensated (though before the pivot), not attempted again,
// until an operator retries it (it finishes) or cancels it (compensated).
func TestHaltParks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		external bool
		cancel   bool
	}{
		{"TxStepRetried", false, false},
		{"ExternalStepRetried", true, false},
		{"TxStepCancelled", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			var halting atomic.Bool
			halting.Store(true)
			var undos, checks, confirms atomic.Int32
			check := func() error {
				checks.Add(1)
				if halting.Load() {
					return engine.Halt("provider_mismatch", "the provider paid another amount")
				}
				return nil
			}
			var checkStep engine.Step[int, int] = engine.TxStep("check", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return check() })
			if tc.external {
				checkStep = engine.ExternalStep("check", func(context.Context, engine.Attempt, int, *int) error { return check() })
			}
			op, err := engine.NewOperation("halting", []engine.Step[int, int]{
				engine.TxStep("reserve", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
					undos.Add(1)
					return nil
				}),
				checkStep,
				engine.TxStep("confirm", func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
					confirms.Add(1)
					return nil
				}),
			}, func(in int, _ *int) (int, error) { return in, nil },
				&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 5}})
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)

			s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
			require.NoError(t, err)
			// Wait does not wait for an operator.
			waitCtx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
			defer cancelWait()
			waited, err := s.Wait(waitCtx)
			require.NoError(t, err)
			require.True(t, waited.Parked)
			require.Equal(t, engine.StatusInProgress, waited.Status)
			waited, err = e.Wait(waitCtx, s.ID)
			require.NoError(t, err)
			require.True(t, waited.Parked)
			info := fsAwait(t, e, s.ID, "parked", fsParked)
			require.Equal(t, engine.StatusInProgress, info.Status)
			require.True(t, info.NeedsAttention())
			require.EqualValues(t, "provider_mismatch", info.Attention.Code)
			require.Contains(t, info.Attention.Reason, "the provider paid another amount")
			require.Equal(t, 1, info.Steps[1].Attempts)
			require.Zero(t, undos.Load(), "a halt compensates nothing")

			fsNoMoreRuns(t, e, pool, s.ID)
			require.Equal(t, int32(1), checks.Load(), "a halted operation was attempted again")
			require.Zero(t, confirms.Load())
			require.Zero(t, undos.Load())

			halting.Store(false)
			if tc.cancel {
				cancelled, err := e.Cancel(ctx, s.ID, "operator: mismatch confirmed")
				require.NoError(t, err)
				require.Equal(t, engine.StatusFailed, cancelled.Status)
				require.EqualValues(t, engine.CodeCancelled, cancelled.Error.Code)
				require.Equal(t, int32(1), undos.Load())
				require.Equal(t, int32(1), checks.Load())
				return
			}
			require.NoError(t, errOf(e.Retry(ctx, s.ID, nil)), nil)
			done := fsWait(t, e, s.ID)
			require.Equal(t, engine.StatusSucceeded, done.Status)
			got := fsGet(t, e, s.ID)
			require.Nil(t, got.Attention)
			require.False(t, got.Parked)
			require.Equal(t, int32(2), checks.Load())
			require.Equal(t, int32(1), confirms.Load())
			require.Zero(t, undos.Load())
		})
	}
}

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
	require.EqualValues(t, engine.CodeAttemptsExhausted, info.Error.Code)
	require.Equal(t, int32(3), f.payCalls.Load())
	got := fsGet(t, e, s.ID)
	require.Equal(t, 3, got.Steps[1].Attempts)
	require.Contains(t, got.Steps[1].LastCause, "Erreur du fournisseur")
}
