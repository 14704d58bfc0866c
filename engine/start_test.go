package engine_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

func TestStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RunsEveryStepOnce", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		started, err := engine.Start(ctx, e, op, "client-a", "key-1", transferIn{From: "a", To: "b", Amount: 100}, nil)
		require.NoError(t, err)
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.NotZero(t, out.LedgerID)
		require.Contains(t, out.PayoutID, "po_")
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))

		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, got.Status)
		require.Equal(t, 1, got.Runs)
		require.JSONEq(t, string(info.Result), string(got.Result))
		require.Len(t, got.Steps, 3)
		for i, name := range []string{"ledger", "payout", "finalize"} {
			require.Equal(t, name, got.Steps[i].Name)
			require.Equal(t, engine.StepStatusSucceeded, got.Steps[i].Status)
			require.Equal(t, 1, got.Steps[i].Attempts)
		}
		require.Regexp(t, `^idf3_[A-Za-z0-9_-]{48}$`, got.Steps[1].DerivedKey)
		require.Empty(t, got.Steps[0].DerivedKey)
	})

	t.Run("SameKeyReplaysWithoutRunning", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		first, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, first)

		again, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 5}, nil)
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, engine.StatusSucceeded, again.Existing.Status)
		require.Equal(t, string(info.Result), string(again.Existing.Result))
		require.ElementsMatch(t, []string{"from", "to", "amount"}, slices.Collect(maps.Keys(again.Existing.Fingerprint.Fields)))
		require.Equal(t, int32(1), b.calls.Load())
	})

	t.Run("ConcurrentSameKeyOneOperation", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		const n = 20
		var wg sync.WaitGroup
		results := make([]*engine.Started, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i], errs[i] = engine.Start(ctx, e, op, "c", "same", transferIn{From: "a", To: "b", Amount: 7}, nil)
			}()
		}
		wg.Wait()
		created := 0
		for i := range n {
			require.NoError(t, errs[i])
			if results[i].Created {
				created++
				waitDone(t, e, results[i])
			}
			require.Equal(t, results[0].ID, results[i].ID)
		}
		require.Equal(t, 1, created)
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("SameKeyTwoScopesTwoOperations", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		s1, err := engine.Start(ctx, e, op, "client-a", "shared", transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		s2, err := engine.Start(ctx, e, op, "client-b", "shared", transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		require.True(t, s1.Created)
		require.True(t, s2.Created)
		require.NotEqual(t, s1.ID, s2.ID)
		waitDone(t, e, s1)
		waitDone(t, e, s2)
		require.Equal(t, books{ledgerRows: 4, payouts: 2, payoutCalls: 2, finals: 2}, readBooks(t, b.pool))
	})

	t.Run("EmptyKeyRejected", func(t *testing.T) {
		t.Parallel()
		e, op, _ := setup(t, setupOpts{})
		_, err := engine.Start(ctx, e, op, "c", "", transferIn{Amount: 1}, nil)
		require.ErrorIs(t, err, engine.ErrInvalidKey)
	})

	t.Run("UnregisteredOperation", func(t *testing.T) {
		t.Parallel()
		e, _, b := setup(t, setupOpts{})
		other := b.transferOp(t, engine.RetryPolicy{})
		_, err := engine.Start(ctx, e, other, "c", "k", transferIn{Amount: 1}, nil)
		require.ErrorIs(t, err, engine.ErrNotRegistered)
	})
}

func TestRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TransientErrorsRetriedInline", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		b.failPayout.Store(2)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		require.Equal(t, 1, got.Runs, "short backoffs are waited out by the run itself")
		require.Equal(t, 1, got.Steps[0].Attempts)
		require.Equal(t, 3, got.Steps[1].Attempts)
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("TransientErrorsRetriedByRiver", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true, inlineRetry: -1})
		b.failPayout.Store(2)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		require.Equal(t, 3, got.Runs)
		require.Equal(t, 1, got.Steps[0].Attempts, "the ledger step never runs again")
		require.Equal(t, 3, got.Steps[1].Attempts)
		require.Empty(t, got.Steps[1].LastError)
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("LostResponseCompletedByLookup", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true})
		b.lostPayout.Store(1)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, int32(1), b.calls.Load(), "the lookup finds the payout: no second call")
		require.Equal(t, int32(1), b.lookups.Load())
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("AttemptsExhaustedFailsAndCompensates", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true, retry: engine.RetryPolicy{MaxAttempts: 3}})
		b.failPayout.Store(100)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, "attempts_exhausted", info.Error.Code)
		require.Equal(t, "payout", info.Error.Step)
		require.Equal(t, int32(3), b.calls.Load())
		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped},
			[]engine.StepStatus{got.Steps[0].Status, got.Steps[1].Status, got.Steps[2].Status})
		require.Equal(t, 3, got.Steps[1].Attempts)
		require.Contains(t, got.Steps[1].LastCause, "provider unavailable")
		require.NotContains(t, got.Steps[1].LastError, "provider unavailable", "the client's text names nothing internal")
		// Before attempts 2 and 3, and after the last, before anything was undone.
		require.Equal(t, int32(3), b.lookups.Load())
		require.Equal(t, books{ledgerRows: 2, reversals: 2}, readBooks(t, b.pool))
	})

	t.Run("TxStepWritesRollBackWithFailedAttempt", func(t *testing.T) {
		t.Parallel()
		pool := setupPool(t)
		calls := 0
		op, err := engine.NewOperation("flaky", []engine.Step[int, int]{
			engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
				calls++
				if _, err := tx.Exec(ctx, `INSERT INTO test_ledger (account, amount) VALUES ('x', $1)`, in); err != nil {
					return err
				}
				*s = 99 // must not survive the failed attempt
				if calls == 1 {
					return errors.New("transient")
				}
				*s += in
				return nil
			}),
		}, func(in int, s *int) (int, error) { return *s, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond}})
		require.NoError(t, err)
		e := idemflowtest.Engine(t, pool, nil, op)
		started, err := engine.Start(ctx, e, op, "c", "k", 5, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.Equal(t, 104, out)
		var rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM test_ledger`).Scan(&rows))
		require.Equal(t, 1, rows)
	})
}

func TestPermanentFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeclineCompensatesLedger", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		b.declinePayout.Store(true)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, "declined", info.Error.Code)
		require.Equal(t, int32(1), b.calls.Load(), "a permanent error is not retried")
		require.Equal(t, books{ledgerRows: 2, reversals: 2}, readBooks(t, b.pool))

		again, err := e.GetByKey(ctx, "c", "k")
		require.NoError(t, err)
		require.Equal(t, "declined", again.Error.Code)
		require.Equal(t, "payout", again.Error.Step)
	})

	t.Run("FirstStepFailureStoresTheAnswer", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: -1}, nil)
		require.NoError(t, err)
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, "invalid_amount", info.Error.Code)
		require.Equal(t, books{}, readBooks(t, b.pool))
	})

	t.Run("CompensationsRunInReverseOrder", func(t *testing.T) {
		t.Parallel()
		pool := setupPool(t)
		var mu sync.Mutex
		var order []string
		step := func(name string, fail bool) engine.Step[int, int] {
			return engine.TxStep(name, func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
				if fail {
					return engine.Fail("nope", "step "+name+" refuses")
				}
				return nil
			}).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, name)
				return nil
			})
		}
		op, err := engine.NewOperation("chain", []engine.Step[int, int]{
			step("a", false), step("b", false), step("c", false), step("d", true), step("e", false),
		}, func(in int, s *int) (int, error) { return 0, nil }, nil)
		require.NoError(t, err)
		e := idemflowtest.Engine(t, pool, nil, op)
		started, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, []string{"c", "b", "a"}, order)
		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		var statuses []engine.StepStatus
		for _, s := range got.Steps {
			statuses = append(statuses, s.Status)
		}
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, statuses)
	})
}

func TestDefinition(t *testing.T) {
	t.Parallel()
	noop := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error { return nil }
	result := func(in int, s *int) (int, error) { return 0, nil }

	tests := []struct {
		name  string
		steps []engine.Step[int, int]
		opts  *engine.OperationOpts
		want  string
	}{
		{"NoSteps", nil, nil, "has no steps"},
		{"DuplicateStep", []engine.Step[int, int]{engine.TxStep("a", noop), engine.TxStep("a", noop)}, nil, "duplicate step name"},
		{"EmptyStepName", []engine.Step[int, int]{engine.TxStep("", noop)}, nil, "has no name"},
		{"StepNameNotUTF8", []engine.Step[int, int]{engine.TxStep("a\xff", noop)}, nil, "is not UTF-8 without NUL"},
		{"StepNameWithNUL", []engine.Step[int, int]{engine.TxStep("a\x00b", noop)}, nil, "is not UTF-8 without NUL"},
		{"NilFunction", []engine.Step[int, int]{engine.TxStep[int, int]("a", nil)}, nil, "has no function"},
		{"NilExternalFunction", []engine.Step[int, int]{engine.ExternalStep[int, int]("a", nil)}, nil, "has no function"},
		{"NilStep", []engine.Step[int, int]{nil}, nil, "step 0 is nil"},
		{"BadFactor", []engine.Step[int, int]{engine.TxStep("a", noop)}, &engine.OperationOpts{Retry: engine.RetryPolicy{Factor: 0.5}}, "factor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := engine.NewOperation("op", tt.steps, result, tt.opts)
			require.ErrorContains(t, err, tt.want)
		})
	}

	t.Run("DuplicateOperation", func(t *testing.T) {
		t.Parallel()
		a, err := engine.NewOperation("same", []engine.Step[int, int]{engine.TxStep("a", noop)}, result, nil)
		require.NoError(t, err)
		b, err := engine.NewOperation("same", []engine.Step[int, int]{engine.TxStep("b", noop)}, result, nil)
		require.NoError(t, err)
		_, err = engine.New(nil, &engine.Config{Operations: []engine.Definition{a, b}})
		require.ErrorIs(t, err, engine.ErrDuplicateOperation)
	})
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	p := engine.RetryPolicy{Base: 100 * time.Millisecond, Factor: 3, Cap: 2 * time.Second}
	tests := []struct {
		attempt int
		want    time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 300 * time.Millisecond},
		{3, 900 * time.Millisecond},
		{4, 2 * time.Second},
		{1000, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.attempt), func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, p.Backoff(tt.attempt))
		})
	}
	require.Equal(t, engine.DefaultRetryBase, engine.RetryPolicy{}.Backoff(1))
}
