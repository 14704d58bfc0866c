package riverjob_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/idemflowtest"
)

// envCrashChild, set to a database URL, makes TestCrashBeforeCommit the child
// that dies.
const envCrashChild = "RIVERJOB_CRASH_CHILD"

// markStarted is what the child prints just before it kills itself.
const markStarted = "riverjob-crash-child: started, not committed"

// TestCrashBeforeCommit: a process killed with SIGKILL after the engine reserved
// the message id and enqueued the operation's run, and before the transaction
// that completes the job commits, leaves nothing: no operation, no effect, the
// job running as River's fetch left it. There is no moment at which the effect
// can have happened and the job not be completed: the reservation that the
// effect needs commits with the job's completion. River's rescuer hands the
// stuck job to the worker again, the producer redelivers the message too, and
// the operation runs once, with one effect.
func TestCrashBeforeCommit(t *testing.T) {
	if url := os.Getenv(envCrashChild); url != "" {
		crashChild(t, url)
		return
	}
	t.Parallel()
	ctx := t.Context()
	url := idemflowtest.DatabaseURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, createSchema(ctx, pool))
	msg := payArgs{MessageID: "msg-crash", Account: "ann", Amount: 30}
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{}) // insert-only
	require.NoError(t, err)
	res, err := inserter.Insert(ctx, msg, nil)
	require.NoError(t, err)
	stuck := res.Job.ID

	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, os.Args[0], "-test.run=^TestCrashBeforeCommit$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envCrashChild+"="+url)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child was not killed:\n%s", out)
	ws, ok := exit.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child did not die of SIGKILL:\n%s", out)
	require.Contains(t, string(out), markStarted)

	// Nothing committed but River's fetch of the job.
	j, err := readJob(ctx, pool, stuck)
	require.NoError(t, err)
	require.Equal(t, rivertype.JobStateRunning, j.State)
	require.Equal(t, 1, j.Attempt)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM idemflow_operation"), "the reservation rolled back")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM river_job WHERE queue = $1", "idemflow"), "no run enqueued")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM receipt"))
	require.Zero(t, bookings(t, pool, msg.MessageID))

	// River's rescuer takes a job for stuck once it has run longer than
	// RescueStuckJobsAfter (an hour by default): let that hour pass.
	_, err = pool.Exec(ctx, "UPDATE river_job SET attempted_at = now() - interval '2 hours' WHERE id = $1", stuck)
	require.NoError(t, err)

	op, err := newOperation()
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{
		Operations:    []engine.Definition{op},
		Lease:         idemflowtest.TestLease,
		SweepInterval: idemflowtest.TestSweepInterval,
		PollInterval:  idemflowtest.TestPollInterval,
		Logger:        slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Stop(sctx))
	})
	w, err := riverjob.New(e, op, config())
	require.NoError(t, err)
	// The consumer's client first, alone: River's leader, whose rescuer runs
	// at once, and knows the job's kind (see TestStuckJobRescue for a leader
	// that does not).
	client := startClient(t, pool, clientConfig(w))
	waitUntil(t, "the stuck job is rescued", func() (bool, error) {
		j, err := readJob(ctx, pool, stuck)
		return j.State != rivertype.JobStateRunning, err
	})
	require.NoError(t, e.StartWorkers(ctx))
	res, err = client.Insert(ctx, msg, nil) // and the producer redelivers it
	require.NoError(t, err)

	jobs := waitJobs(t, pool, stuck, res.Job.ID)
	require.Equal(t, rivertype.JobStateCompleted, jobs[0].State)
	require.Equal(t, 2, jobs[0].Attempt)
	require.Equal(t, rivertype.JobStateCompleted, jobs[1].State)
	info := waitOperation(t, e, msg.MessageID)
	require.Equal(t, 1, bookings(t, pool, msg.MessageID), "one effect")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM idemflow_operation"))
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM receipt WHERE operation_id = $1", info.ID))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM receipt WHERE created"))
}

// crashChild works the message's job and kills itself with SIGKILL in the
// job's transaction, after StartTx and before the commit.
func crashChild(t *testing.T, url string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	op, err := newOperation()
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	cfg := config()
	cfg.StartedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], started *engine.Started) error {
		if err := recordReceipt(ctx, tx, job, started); err != nil {
			return err
		}
		fmt.Println(markStarted)
		_ = os.Stdout.Sync()
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	w, err := riverjob.New(e, op, cfg)
	require.NoError(t, err)
	rc := clientConfig(w)
	rc.LeaderElectionDisabled = true // the test process's client leads, once this one is dead
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	require.NoError(t, err)
	require.NoError(t, client.Start(ctx))
	time.Sleep(30 * time.Second) // until SIGKILL
	t.Fatal("the child was not killed")
}

// consumerSchema is the River schema of the consumer's client in
// TestStuckJobRescue.
const consumerSchema = "consumer"

// TestStuckJobRescue: a job left running by a dead process is rescued by
// River's leader, whichever client of the database and schema that is. A
// leader that has no worker for the job's kind discards it: the engine's own
// River client is eligible to lead and knows only the engine's kinds. A
// consumer whose River client has a schema of its own has a leader of its own.
func TestStuckJobRescue(t *testing.T) {
	t.Parallel()
	msg := payArgs{MessageID: "msg-stuck", Account: "ann", Amount: 30}

	// stick inserts the message's job and leaves it as a process that died
	// two hours into its attempt leaves it.
	stick := func(t *testing.T, pool *pgxpool.Pool, schema string) int64 {
		t.Helper()
		inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Schema: schema})
		require.NoError(t, err)
		res, err := inserter.Insert(t.Context(), msg, nil)
		require.NoError(t, err)
		const set = ` SET state = 'running', attempt = 1, attempted_at = now() - interval '2 hours', attempted_by = '{dead}' WHERE id = $1`
		update := "UPDATE river_job" + set
		if schema == consumerSchema {
			update = "UPDATE consumer.river_job" + set
		}
		_, err = pool.Exec(t.Context(), update, res.Job.ID)
		require.NoError(t, err)
		return res.Job.ID
	}

	t.Run("the engine's leader discards it", func(t *testing.T) {
		t.Parallel()
		pool := idemflowtest.Pool(t, createSchema)
		id := stick(t, pool, "")
		op, err := newOperation()
		require.NoError(t, err)
		idemflowtest.Engine(t, pool, nil, op) // the only client: the leader
		j := waitJobs(t, pool, id)[0]
		require.Equal(t, rivertype.JobStateDiscarded, j.State, "the message is lost to the consumer")
		require.Zero(t, count(t, pool, "SELECT count(*) FROM idemflow_operation"))
	})

	t.Run("the consumer's own schema", func(t *testing.T) {
		t.Parallel()
		pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
			if err := createSchema(ctx, pool); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, "CREATE SCHEMA consumer"); err != nil {
				return err
			}
			m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: consumerSchema, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				return err
			}
			_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
			return err
		})
		id := stick(t, pool, consumerSchema)
		op, err := newOperation()
		require.NoError(t, err)
		e := idemflowtest.Engine(t, pool, nil, op) // leads the engine's schema
		w, err := riverjob.New(e, op, config())
		require.NoError(t, err)
		rc := clientConfig(w)
		rc.Schema = consumerSchema
		startClient(t, pool, rc) // leads the consumer's
		readConsumerJob := func() (job, error) {
			var j job
			err := pool.QueryRow(t.Context(), "SELECT state, attempt FROM consumer.river_job WHERE id = $1", id).Scan(&j.State, &j.Attempt)
			return j, err
		}
		waitUntil(t, "the stuck job completes", func() (bool, error) {
			j, err := readConsumerJob()
			if err == nil && j.State != rivertype.JobStateRunning && j.State != rivertype.JobStateRetryable && j.State != rivertype.JobStateAvailable {
				if j.State != rivertype.JobStateCompleted {
					return false, errors.New("the job ended " + string(j.State))
				}
				return true, nil
			}
			return false, err
		})
		j, err := readConsumerJob()
		require.NoError(t, err)
		require.Equal(t, 2, j.Attempt)
		waitOperation(t, e, msg.MessageID)
		require.Equal(t, 1, bookings(t, pool, msg.MessageID))
	})
}
