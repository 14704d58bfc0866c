package riverjob_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/idemflowtest"
)

// atOnce makes the job that starts a message's operation wait, in its
// transaction, until n jobs of the message are running: the others are worked
// while the first has reserved the id and not committed.
func atOnce(n int) func(pool *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
	return func(pool *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
		cfg.StartedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], started *engine.Started) error {
			if started.Created {
				if err := waitRunning(ctx, pool, job.Args.MessageID, n); err != nil {
					return err
				}
			}
			return recordReceipt(ctx, tx, job, started)
		}
	}
}

func waitRunning(ctx context.Context, pool *pgxpool.Pool, id string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		var running int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job
			WHERE kind = $1 AND args->>'message_id' = $2 AND state = 'running'`, payArgs{}.Kind(), id).Scan(&running); err != nil {
			return fmt.Errorf("%d jobs of %s never ran at once: %w", n, id, err)
		}
		if running >= n {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDuplicates: however often a message is delivered, in a row or at once,
// there is one operation and one effect, and every delivery's job completes.
func TestDuplicates(t *testing.T) {
	t.Parallel()
	msg := payArgs{MessageID: "msg-1", Account: "ann", Amount: 30}
	tests := []struct {
		name string
		mod  func(*pgxpool.Pool, *riverjob.Config[payArgs, payIn])
		// deliver delivers the message and returns its jobs.
		deliver func(t *testing.T, b *bundle) []int64
	}{
		{"twice in a row", nil, func(t *testing.T, b *bundle) []int64 {
			first := b.deliver(t, msg)
			waitJobs(t, b.pool, first...)
			b.finished(t, msg.MessageID) // the second finds it finished
			return append(first, b.deliver(t, msg)...)
		}},
		{"twice at once", atOnce(2), func(t *testing.T, b *bundle) []int64 {
			return b.deliver(t, msg, msg)
		}},
		{"five times", atOnce(3), func(t *testing.T, b *bundle) []int64 {
			ids := b.deliver(t, msg, msg, msg)
			waitJobs(t, b.pool, ids...)
			b.finished(t, msg.MessageID)
			return append(ids, b.deliver(t, msg, msg)...)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.mod)
			ids := tt.deliver(t, b)
			for i, j := range waitJobs(t, b.pool, ids...) {
				require.Equal(t, rivertype.JobStateCompleted, j.State, "job %d", ids[i])
				require.Equal(t, 1, j.Attempt, "job %d", ids[i])
			}
			info := b.finished(t, msg.MessageID)
			require.Equal(t, 1, bookings(t, b.pool, msg.MessageID), "one effect")
			require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM idemflow_operation"), "one operation")
			require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM river_job WHERE queue = $1 AND strpos(args::text, $2) > 0",
				"idemflow", info.ID.String()), "one run enqueued: a duplicate enqueues nothing")
			require.Equal(t, len(ids), count(t, b.pool, "SELECT count(*) FROM receipt WHERE operation_id = $1", info.ID),
				"every delivery found the operation")
			require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM receipt WHERE created"), "one delivery started it")
			require.Zero(t, count(t, b.pool, "SELECT count(*) FROM rejection"))
		})
	}
}

// TestRejected: a message that reuses an id with another body is rejected: its
// job is cancelled, never retried, the rejection recorded with the
// cancellation, and the first message's operation and effect are untouched.
func TestRejected(t *testing.T) {
	t.Parallel()
	first := payArgs{MessageID: "msg-1", Account: "ann", Amount: 30}
	other := payArgs{MessageID: "msg-1", Account: "ann", Amount: 45}

	check := func(t *testing.T, b *bundle, accepted, rejected int64, acceptedArgs payArgs) {
		t.Helper()
		jobs := waitJobs(t, b.pool, accepted, rejected)
		require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
		require.Equal(t, rivertype.JobStateCancelled, jobs[1].State)
		require.Equal(t, 1, jobs[1].Attempt, "not retried")
		require.Len(t, jobs[1].Errors, 1)
		require.Contains(t, jobs[1].Metadata, "cancel_attempted_at", "cancelled in the rejection's transaction")
		out := jobs[1].output(t)
		require.Equal(t, []string{"amount"}, out.Fields)
		require.Equal(t, first.MessageID, out.MessageID)
		require.Equal(t, scope, out.Scope)
		require.Contains(t, out.Error, "idempotency key reused with a different input")

		info := b.finished(t, first.MessageID)
		result, err := b.op.Result(info)
		require.NoError(t, err)
		require.Equal(t, acceptedArgs.Amount, result)
		require.Equal(t, out.OperationID, info.ID.String())
		require.Equal(t, 1, bookings(t, b.pool, first.MessageID), "no second effect")
		require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM booking WHERE amount = $1", acceptedArgs.Amount))
		require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM idemflow_operation"))

		var reason string
		require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT reason FROM rejection WHERE job_id = $1", rejected).Scan(&reason))
		require.Contains(t, reason, "fields that differ: amount")
		require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM rejection"))
	}

	t.Run("after the first", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		accepted := b.deliver(t, first)[0]
		waitJobs(t, b.pool, accepted)
		rejected := b.deliver(t, other)[0]
		check(t, b, accepted, rejected, first)
	})

	t.Run("at once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, atOnce(2))
		ids := b.deliver(t, first, other)
		jobs := waitJobs(t, b.pool, ids...)
		accepted, rejected, args := ids[0], ids[1], first
		if jobs[0].State == rivertype.JobStateCancelled {
			accepted, rejected, args = ids[1], ids[0], other
		}
		check(t, b, accepted, rejected, args)
	})

	t.Run("empty id", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		id := b.deliver(t, payArgs{Account: "ann", Amount: 30})[0]
		j := waitJobs(t, b.pool, id)[0]
		require.Equal(t, rivertype.JobStateCancelled, j.State)
		require.Equal(t, 1, j.Attempt)
		require.Contains(t, j.output(t).Error, engine.ErrInvalidKey.Error())
		require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM rejection WHERE job_id = $1", id))
		require.Zero(t, count(t, b.pool, "SELECT count(*) FROM idemflow_operation"))
	})
}

// TestRejectedFuncFails: a RejectedFunc that fails rolls the cancellation back
// with it: the job is retried, and the rejection is recorded once, by the
// attempt that cancels the job.
func TestRejectedFuncFails(t *testing.T) {
	t.Parallel()
	b := setup(t, func(_ *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
		cfg.RejectedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], err error) error {
			if err := recordRejection(ctx, tx, job, err); err != nil {
				return err
			}
			if job.Attempt == 1 {
				return errors.New("the rejection's record failed")
			}
			return nil
		}
	})
	first := b.deliver(t, payArgs{MessageID: "msg-1", Account: "ann", Amount: 30})[0]
	waitJobs(t, b.pool, first)
	id := b.deliver(t, payArgs{MessageID: "msg-1", Account: "ann", Amount: 45})[0]
	j := waitJobs(t, b.pool, id)[0]
	require.Equal(t, rivertype.JobStateCancelled, j.State)
	require.Equal(t, 2, j.Attempt)
	require.Contains(t, j.Errors[0], "the rejection's record failed")
	require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM rejection WHERE job_id = $1", id))
	require.Equal(t, 1, bookings(t, b.pool, "msg-1"))
}

// TestRollbackBeforeCommit: an attempt that fails between StartTx and the
// commit (here StartedFunc, after the engine reserved the id and enqueued the
// run) leaves nothing behind: no operation, no run, no effect. River retries
// the job, whose next attempt starts the operation anew, and it runs once.
func TestRollbackBeforeCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(_ *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
		cfg.StartedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], started *engine.Started) error {
			if job.Attempt == 1 {
				return errors.New("lost between the start and the commit")
			}
			return recordReceipt(ctx, tx, job, started)
		}
	})
	id := b.deliver(t, payArgs{MessageID: "msg-1", Account: "ann", Amount: 30})[0]
	j := waitJobs(t, b.pool, id)[0]
	require.Equal(t, rivertype.JobStateCompleted, j.State)
	require.Equal(t, 2, j.Attempt)
	info := b.finished(t, "msg-1")
	require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM river_job WHERE queue = $1 AND strpos(args::text, $2) > 0",
		"idemflow", info.ID.String()), "one run enqueued: the first attempt's rolled back")
	require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM idemflow_operation"))
	require.Equal(t, 1, bookings(t, b.pool, "msg-1"))
	require.Equal(t, 1, count(t, b.pool, "SELECT count(*) FROM receipt WHERE created AND attempt = 2"),
		"the second attempt found no operation: the first's reservation rolled back")
}

// TestNew: what New refuses.
func TestNew(t *testing.T) {
	t.Parallel()
	pool := idemflowtest.Pool(t, nil)
	op, err := newOperation()
	require.NoError(t, err)
	other, err := newOperation()
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	tests := []struct {
		name string
		new  func() error
		want string
	}{
		{"no engine", func() error { _, err := riverjob.New(nil, op, config()); return err }, "an engine is required"},
		{"no operation", func() error {
			_, err := riverjob.New[payArgs, payIn, payState, int64](e, nil, config())
			return err
		}, "an operation type is required"},
		{"no config", func() error { _, err := riverjob.New[payArgs](e, op, nil); return err }, "a config is required"},
		{"no message function", func() error {
			_, err := riverjob.New(e, op, &riverjob.Config[payArgs, payIn]{})
			return err
		}, "a message function is required"},
		{"not registered", func() error { _, err := riverjob.New(e, other, config()); return err }, "operation type not registered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorContains(t, tt.new(), tt.want)
		})
	}
	_, err = riverjob.New(e, op, config())
	require.NoError(t, err)
}

// TestCancelFromFuncs: MessageFunc and StartedFunc cancel the job by returning
// river.JobCancel, and then nothing commits: no operation, no effect.
func TestCancelFromFuncs(t *testing.T) {
	t.Parallel()
	refuse := river.JobCancel(errors.New("not for us"))
	tests := []struct {
		name string
		mod  func(*pgxpool.Pool, *riverjob.Config[payArgs, payIn])
	}{
		{"MessageFunc", func(_ *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
			cfg.MessageFunc = func(*river.Job[payArgs]) (riverjob.Message[payIn], error) {
				return riverjob.Message[payIn]{}, refuse
			}
		}},
		{"StartedFunc", func(_ *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn]) {
			cfg.StartedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], started *engine.Started) error {
				if err := recordReceipt(ctx, tx, job, started); err != nil {
					return err
				}
				return refuse
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.mod)
			id := b.deliver(t, payArgs{MessageID: "msg-1", Account: "ann", Amount: 30})[0]
			j := waitJobs(t, b.pool, id)[0]
			require.Equal(t, rivertype.JobStateCancelled, j.State)
			require.Equal(t, 1, j.Attempt)
			require.Contains(t, j.Errors[0], "not for us")
			require.Zero(t, count(t, b.pool, "SELECT count(*) FROM idemflow_operation"))
			require.Zero(t, count(t, b.pool, "SELECT count(*) FROM receipt"))
			require.Zero(t, count(t, b.pool, "SELECT count(*) FROM rejection"), "not a rejection")
		})
	}
}
