package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

const atCommitSchema = `
CREATE TABLE test_at_commit (step text NOT NULL, n int NOT NULL CHECK (n > 0));
CREATE TABLE test_attempt (step text NOT NULL);
`

// atCommitOp is a tx, external, tx operation whose tx steps write through
// engine.AtCommit, and with plain also send a write at once. Each tx step's
// AtCommit write violates a CHECK while fail says so.
func atCommitOp(t *testing.T, plain bool, fail map[string]*atomic.Int32, calls *atomic.Int32) *engine.Operation[int, int, int] {
	t.Helper()
	write := func(name string) func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
		return func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
			// A plain write, sent at once: it must not outlive a failed attempt.
			if plain {
				if _, err := tx.Exec(ctx, `INSERT INTO test_attempt (step) VALUES ($1)`, name); err != nil {
					return err
				}
			}
			n := 1
			if fail[name] != nil && fail[name].Add(-1) >= 0 {
				n = 0
			}
			*s += n
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO test_at_commit (step, n) VALUES ($1, $2)`, name, n)
			return err
		}
	}
	op, err := engine.NewOperation("at_commit", []engine.Step[int, int]{
		engine.TxStep("first", write("first")),
		engine.ExternalStep("call", func(context.Context, engine.Attempt, int, *int) error {
			calls.Add(1)
			return nil
		}),
		engine.TxStep("last", write("last")),
	}, func(in int, s *int) (int, error) { return *s, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: 1}})
	require.NoError(t, err)
	return op
}

// TestAtCommit: a statement queued with AtCommit commits with the step's
// checkpoint; when it fails, nothing of the step's transaction commits, the
// attempt fails and is retried, and the checkpoints the transaction carried for
// earlier steps are not lost (the external step is not called again).
func TestAtCommit(t *testing.T) {
	t.Parallel()
	for _, failing := range []string{"", "first", "last"} {
		t.Run("failing="+failing, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			_, err := pool.Exec(ctx, atCommitSchema)
			require.NoError(t, err)
			fail := map[string]*atomic.Int32{}
			if failing != "" {
				fail[failing] = &atomic.Int32{}
				fail[failing].Store(1)
			}
			var calls atomic.Int32
			op := atCommitOp(t, true, fail, &calls)
			e := idemflowtest.Engine(t, pool, nil, op)

			started, err := engine.Start(ctx, e, op, "c", "k", 0, nil)
			require.NoError(t, err)
			info := waitDone(t, e, started)
			require.Equal(t, engine.StatusSucceeded, info.Status, "%+v", info.Error)
			out, err := op.Result(info)
			require.NoError(t, err)
			require.Equal(t, 2, out, "the state of the failed attempt was dropped")
			require.Equal(t, int32(1), calls.Load())

			got, err := e.Get(ctx, started.ID)
			require.NoError(t, err)
			for _, st := range got.Steps {
				want := 1
				if st.Name == failing {
					want = 2
				}
				require.Equal(t, want, st.Attempts, st.Name)
			}
			var written, attempts int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM test_at_commit`).Scan(&written))
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM test_attempt`).Scan(&attempts))
			require.Equal(t, 2, written)
			require.Equal(t, 2, attempts, "the failed attempt's own write rolled back with it")
		})
	}
}

// TestAtCommitCost: tx steps that write only through AtCommit cost one round
// trip per transaction, reservation, checkpoint and commit included, and the
// engine two statements of its own.
func TestAtCommitCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, counter := countedPool(t, atCommitSchema)
	var calls atomic.Int32
	op := atCommitOp(t, false, nil, &calls)
	// No workers: nothing but the first attempt sends anything.
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.WithoutCancel(ctx))) })

	for i := range 3 {
		counter.reset()
		started, err := engine.Start(ctx, e, op, "c", fmt.Sprint("k", i), 0, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, waitDone(t, e, started).Status)
		counter.mu.Lock()
		require.Equal(t, 2, counter.commits)
		// The reservation, the step's write and its checkpoint in one; the last
		// step's write, the checkpoints and the result in the other. Each is a
		// batch that PostgreSQL runs as one implicit transaction: no BEGIN, no
		// COMMIT.
		require.Equal(t, 2, counter.roundTrips)
		require.Zero(t, counter.begins)
		// The reservation carries the first step's checkpoint: two statements
		// of the engine's own, as many as a hand-written refund sends.
		require.Equal(t, []string{"OperationReserve", "OperationFinish"}, counter.engine)
		counter.mu.Unlock()
	}
}

// TestFailFromSQL: a statement that calls idemflow_fail fails its step for good
// with that code and message, whether the step returned its error or sent it
// with AtCommit.
func TestFailFromSQL(t *testing.T) {
	t.Parallel()
	for _, atCommit := range []bool{false, true} {
		t.Run(fmt.Sprint("atCommit=", atCommit), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			var calls atomic.Int32
			op, err := engine.NewOperation("sql_fail", []engine.Step[int, int]{
				engine.TxStep("check", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
					calls.Add(1)
					if atCommit {
						tx = engine.AtCommit(tx)
					}
					_, err := tx.Exec(ctx, `SELECT CASE WHEN $1::int > 10 THEN idemflow_fail('too_big', format('%s is more than 10', $1::int)) END`, in)
					return err
				}),
			}, func(in int, s *int) (int, error) { return in, nil }, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: 1}})
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, nil, op)

			started, err := engine.Start(ctx, e, op, "c", "small", 3, nil)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, waitDone(t, e, started).Status)

			started, err = engine.Start(ctx, e, op, "c", "big", 11, nil)
			require.NoError(t, err)
			info := waitDone(t, e, started)
			require.Equal(t, engine.StatusFailed, info.Status)
			require.EqualValues(t, "too_big", info.Error.Code)
			require.Equal(t, "11 is more than 10", info.Error.Message)
			require.Equal(t, "check", info.Error.Step)
			require.Equal(t, int32(2), calls.Load(), "a permanent failure is not retried")
		})
	}
}
