package engine_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

const sqlGuardSchema = `
CREATE TABLE test_guard_order (
    id     text    PRIMARY KEY,
    amount bigint  NOT NULL,
    taken  bigint  NOT NULL DEFAULT 0,
    marked boolean NOT NULL DEFAULT false
);
INSERT INTO test_guard_order (id, amount, marked) VALUES ('open', 100, false), ('marked', 100, true);
`

// The guards of the operation's steps, in the refund's style: every statement
// goes with AtCommit, and fails on its own when the step must not succeed.
const (
	// A scalar subquery over no row is NULL: idemflow_check fails on it.
	guardOrderExists = `SELECT idemflow_check((SELECT true FROM test_guard_order WHERE id = $1),
	'order_not_found', format('order %s does not exist', $1::text))`
	guardTake = `
WITH taken AS (
    UPDATE test_guard_order SET taken = taken + $2::bigint
    WHERE id = $1 AND $2::bigint <= amount - taken
    RETURNING id
)
SELECT idemflow_check(EXISTS (SELECT 1 FROM taken),
    'amount_exceeded', format('order %s has less than %s left', $1::text, $2::bigint))`
	guardMark = `
WITH marked AS (
    UPDATE test_guard_order SET marked = true WHERE id = $1 AND NOT marked RETURNING id
)
SELECT idemflow_check(EXISTS (SELECT 1 FROM marked), 'already_marked', format('order %s is marked already', $1::text))`
	// An ordinary error, which is no guard's: the attempt fails and is retried.
	divideBy = `SELECT 1 / $1::int > 0`
)

type guardIn struct {
	Order  string `json:"order"`
	Amount int64  `json:"amount"`
	// Flaky makes take's first attempt fail with an ordinary error.
	Flaky bool `json:"flaky"`
}

// guardCounts counts what the steps did.
type guardCounts struct {
	takes, calls, marks, undos atomic.Int32
}

// guardSetup returns an engine that runs an operation of a guarded take, an
// external call (the pivot) and a guarded mark, on a database of its own.
func guardSetup(t *testing.T) (*engine.Engine, *engine.Operation[guardIn, int, int64], *pgxpool.Pool, *guardCounts) {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), sqlGuardSchema)
	require.NoError(t, err)
	counts := &guardCounts{}
	take := func(ctx context.Context, tx engine.Tx, at engine.Attempt, in guardIn, _ *int) error {
		counts.takes.Add(1)
		tx = engine.AtCommit(tx)
		if in.Flaky {
			divisor := 1
			if at.Number == 1 {
				divisor = 0
			}
			if _, err := tx.Exec(ctx, divideBy, divisor); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, guardOrderExists, in.Order); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, guardTake, in.Order, in.Amount)
		return err
	}
	untake := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in guardIn, _ *int) error {
		counts.undos.Add(1)
		_, err := tx.Exec(ctx, `UPDATE test_guard_order SET taken = taken - $2 WHERE id = $1`, in.Order, in.Amount)
		return err
	}
	mark := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in guardIn, _ *int) error {
		counts.marks.Add(1)
		_, err := engine.AtCommit(tx).Exec(ctx, guardMark, in.Order)
		return err
	}
	op, err := engine.NewOperation("sql_guard", []engine.Step[guardIn, int]{
		engine.TxStep("take", take).Compensate(untake),
		engine.ExternalStep("call", func(context.Context, engine.Attempt, guardIn, *int) error {
			counts.calls.Add(1)
			return nil
		}),
		engine.TxStep("mark", mark),
	}, func(in guardIn, _ *int) (int64, error) { return in.Amount, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: 1}})
	require.NoError(t, err)
	return idemflowtest.Engine(t, pool, nil, op), op, pool, counts
}

// guardOrder reads what the steps left of an order.
func guardOrder(t *testing.T, pool *pgxpool.Pool, id string) (taken int64, marked bool) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT taken, marked FROM test_guard_order WHERE id = $1`, id).Scan(&taken, &marked))
	return taken, marked
}

// TestSQLGuard: an AtCommit statement that calls idemflow_check commits with
// the step when the check holds, and otherwise fails the step for good with
// the check's code and message (a NULL fails too), writing nothing: before
// the pivot the operation ends failed with that error, after it the operation
// is parked. Any other error of an AtCommit statement fails only the attempt.
func TestSQLGuard(t *testing.T) {
	t.Parallel()

	t.Run("Passes", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e, op, pool, counts := guardSetup(t)
		started, err := engine.Start(ctx, e, op, "c", "k", guardIn{Order: "open", Amount: 40}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status, "%+v", info.Error)
		taken, marked := guardOrder(t, pool, "open")
		require.Equal(t, int64(40), taken)
		require.True(t, marked)
		require.Equal(t, [3]int32{1, 1, 1}, [3]int32{counts.takes.Load(), counts.calls.Load(), counts.marks.Load()})
	})

	for _, tc := range []struct {
		name, order   string
		amount        int64
		code, message string
	}{
		{"Fails", "open", 101, "amount_exceeded", "order open has less than 101 left"},
		{"FailsOnNull", "missing", 1, "order_not_found", "order missing does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e, op, pool, counts := guardSetup(t)
			started, err := engine.Start(ctx, e, op, "c", "k", guardIn{Order: tc.order, Amount: tc.amount}, nil)
			require.NoError(t, err)
			info := waitDone(t, e, started)
			require.Equal(t, engine.StatusFailed, info.Status)
			require.EqualValues(t, tc.code, info.Error.Code)
			require.Equal(t, tc.message, info.Error.Message)
			require.Equal(t, "take", info.Error.Step)
			require.False(t, info.Error.ServerFault(), "a business answer")
			require.Equal(t, int32(1), counts.takes.Load(), "a permanent failure is not retried")
			require.Zero(t, counts.calls.Load())
			require.Zero(t, counts.undos.Load(), "nothing of the failed step to undo")
			taken, _ := guardOrder(t, pool, "open")
			require.Zero(t, taken, "the failed step wrote nothing")

			got, err := e.Get(ctx, started.ID)
			require.NoError(t, err)
			require.Equal(t, engine.StepStatusFailed, got.Steps[0].Status)
			require.Equal(t, 1, got.Steps[0].Attempts)
			require.Equal(t, tc.message, got.Steps[0].LastError)
		})
	}

	t.Run("PastPivotParks", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e, op, pool, counts := guardSetup(t)
		started, err := engine.Start(ctx, e, op, "c", "k", guardIn{Order: "marked", Amount: 10}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.True(t, info.Parked)
		require.EqualValues(t, engine.CodeFailedPastPivot, info.Attention.Code)
		require.Contains(t, info.Attention.Reason, "already_marked: order marked is marked already")
		require.Nil(t, info.Error)
		require.Equal(t, [4]int32{1, 1, 1, 0}, [4]int32{counts.takes.Load(), counts.calls.Load(), counts.marks.Load(), counts.undos.Load()},
			"the mark is not retried and nothing is compensated past the pivot")
		taken, _ := guardOrder(t, pool, "marked")
		require.Equal(t, int64(10), taken)
	})

	t.Run("OtherErrorRetried", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		e, op, pool, counts := guardSetup(t)
		started, err := engine.Start(ctx, e, op, "c", "k", guardIn{Order: "open", Amount: 40, Flaky: true}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status, "%+v", info.Error)
		require.Equal(t, int32(2), counts.takes.Load(), "division by zero failed the first attempt only")
		taken, _ := guardOrder(t, pool, "open")
		require.Equal(t, int64(40), taken, "the failed attempt's writes rolled back")
	})
}
