package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

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
		require.EqualValues(t, "attempts_exhausted", info.Error.Code)
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
	require.Equal(t, defaultRetryBase, engine.RetryPolicy{}.Backoff(1))
}
