package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

// TestFenceByRun: a run that lost its operation to another run, which then
// failed the step for good, writes nothing when it goes on: not its step's
// writes, not its checkpoint, not its failure records, whichever way its
// attempt ends. Run A is held at the step before it has sent anything (so
// it holds no lock on the operation's row), its lease is made to run out (by
// SQL: a pause, as of a process stopped for a while, without A noticing), and
// run B, in another engine, takes the operation over, fails the step,
// compensates and ends the operation. Then A goes on.
func TestFenceByRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// work is run A's step once it goes on.
		work func(ctx context.Context, tx engine.Tx) error
	}{
		{"Succeeds", func(ctx context.Context, tx engine.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('A')`)
			return err
		}},
		{"SucceedsAtCommit", func(ctx context.Context, tx engine.Tx) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('A')`)
			return err
		}},
		{"FailsTransiently", func(context.Context, engine.Tx) error { return errors.New("A: flaky") }},
		{"FailsForGood", func(context.Context, engine.Tx) error { return engine.Fail("a_refuses", "A refuses") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			_, err := pool.Exec(ctx, `CREATE TABLE fs_fence (run text NOT NULL)`)
			require.NoError(t, err)
			var undos atomic.Int32
			opA := fsFencedOp(t, &undos, func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
				return tc.work(ctx, tx)
			})
			opB := fsFencedOp(t, &undos, func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
				return engine.Fail("b_refuses", "B refuses")
			})

			gate := newFSGate(fsAt("work", faults.PointBefore, 1))
			// A's lease is long enough that it never renews during the test.
			a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: time.Hour, Faults: engine.Faults{Hook: gate.hook}}, opA)
			b := idemflowtest.Engine(t, pool, &engine.Config{Lease: time.Second}, opB)

			s, err := engine.Start(ctx, a, opA, "c", "k", 1, nil)
			require.NoError(t, err)
			gate.wait(t)
			_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
			require.NoError(t, err)
			byB := fsWait(t, b, s.ID)
			require.Equal(t, engine.StatusFailed, byB.Status)
			require.EqualValues(t, "b_refuses", byB.Error.Code)

			type stepRow struct {
				state, lastError, lastCause string
				attempts                    int
			}
			readWork := func() stepRow {
				var r stepRow
				require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempts, coalesce(last_error, ''), coalesce(last_cause, '')
					FROM idemflow_step_row WHERE operation_id = $1 AND name = 'work'`, s.ID).Scan(&r.state, &r.attempts, &r.lastError, &r.lastCause))
				return r
			}
			asB := readWork()
			require.Equal(t, "failed", asB.state)
			require.Equal(t, "B refuses", asB.lastError)

			// A goes on, and its run ends: Stop returns once it has.
			gate.open()
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, a.Stop(stopCtx))

			require.Equal(t, asB, readWork(), "the stale run rewrote the step B failed")
			require.Equal(t, []string{"undo"}, fsFenceRows(t, pool), "only B's compensation wrote")
			require.Equal(t, int32(1), undos.Load())
			got := fsGet(t, b, s.ID)
			require.Equal(t, engine.StatusFailed, got.Status)
			require.EqualValues(t, "b_refuses", got.Error.Code)
			require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
			require.Equal(t, 2, got.Runs)
		})
	}
}

// fsFencedOp is the operation of the fence tests: prep, whose compensation
// writes "undo" to fs_fence and counts in undos, work, and finish.
func fsFencedOp(t *testing.T, undos *atomic.Int32, work func(context.Context, engine.Tx, engine.Attempt, int, *int) error) *engine.Operation[int, int, int] {
	t.Helper()
	op, err := engine.NewOperation("fenced", []engine.Step[int, int]{
		engine.TxStep("prep", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			undos.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('undo')`)
			return err
		}),
		engine.TxStep("work", work),
		// work is not the last step: the last one's commit ends the
		// operation, and that statement is fenced on its own.
		engine.TxStep("finish", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3}})
	require.NoError(t, err)
	return op
}

// fsFenceRows returns what fs_fence holds, sorted.
func fsFenceRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	r, err := pool.Query(context.Background(), `SELECT run FROM fs_fence ORDER BY run`)
	require.NoError(t, err)
	rows, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	return rows
}

// TestFenceByRunWhileNewHolderWorks: a run that lost its operation writes
// nothing while the run that took it over is still at the same step, before
// that run has written anything either: only the fence by run tells the two
// apart (no checkpoint of the new holder's is there to collide with).
func TestFenceByRunWhileNewHolderWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE fs_fence (run text NOT NULL)`)
	require.NoError(t, err)
	var undos atomic.Int32
	write := func(run string) func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
		return func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ($1)`, run)
			return err
		}
	}
	opA, opB := fsFencedOp(t, &undos, write("A")), fsFencedOp(t, &undos, write("B"))
	gateA := newFSGate(fsAt("work", faults.PointBefore, 1))
	gateB := newFSGate(func(ev faults.Event) bool {
		return ev.Step == "work" && ev.Point == faults.PointBefore && ev.Resumed
	})
	a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: time.Hour, Faults: engine.Faults{Hook: gateA.hook}}, opA)
	b := idemflowtest.Engine(t, pool, &engine.Config{Lease: 5 * time.Second, Faults: engine.Faults{Hook: gateB.hook}}, opB)

	s, err := engine.Start(ctx, a, opA, "c", "k", 1, nil)
	require.NoError(t, err)
	gateA.wait(t)
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	gateB.wait(t) // B holds the operation, at the same step, and has sent nothing

	gateA.open()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, a.Stop(stopCtx))
	require.Empty(t, fsFenceRows(t, pool), "the stale run wrote while another run held the operation")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_step_row WHERE operation_id = $1 AND name = 'work'`, s.ID).Scan(&rows))
	require.Zero(t, rows, "the stale run checkpointed the step")

	gateB.open()
	done := fsWait(t, b, s.ID)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.Equal(t, []string{"B"}, fsFenceRows(t, pool))
	require.Equal(t, 2, fsGet(t, b, s.ID).Runs)
	require.Zero(t, undos.Load())
}
