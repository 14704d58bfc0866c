package riverjob_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/idemflowtest"
)

// The consumer's queue and the scope of its message ids.
const (
	queue = "payments"
	scope = "payments-topic"
)

// payArgs is a message as a River job: the producer's id and the body.
type payArgs struct {
	MessageID string `json:"message_id"`
	Account   string `json:"account"`
	Amount    int64  `json:"amount"`
}

func (payArgs) Kind() string { return "riverjob_payment" }

func (payArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: queue} }

type payIn struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

type payState struct{}

type payOp = engine.Operation[payIn, payState, int64]

// schema is the application's: booking is the effect (one row per run of the
// operation's step, no unique key, so that a second effect would show),
// rejection and receipt what RejectedFunc and StartedFunc record.
const schema = `
CREATE TABLE booking (message_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL);
CREATE TABLE rejection (job_id bigint PRIMARY KEY, message_id text NOT NULL, reason text NOT NULL);
CREATE TABLE receipt (job_id bigint NOT NULL, attempt int NOT NULL, operation_id uuid NOT NULL, created boolean NOT NULL);
`

func createSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, schema)
	return err
}

func newOperation() (*payOp, error) {
	return engine.NewOperation("riverjob_payment", []engine.Step[payIn, payState]{
		engine.TxStep("book", func(ctx context.Context, tx engine.Tx, at engine.Attempt, in payIn, _ *payState) error {
			_, err := tx.Exec(ctx, "INSERT INTO booking (message_id, account, amount) VALUES ($1, $2, $3)", at.OperationKey, in.Account, in.Amount)
			return err
		}),
	}, func(in payIn, _ *payState) (int64, error) { return in.Amount, nil }, nil)
}

func message(job *river.Job[payArgs]) (riverjob.Message[payIn], error) {
	return riverjob.Message[payIn]{Scope: scope, ID: job.Args.MessageID, Input: payIn{Account: job.Args.Account, Amount: job.Args.Amount}}, nil
}

func recordRejection(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], err error) error {
	_, err = tx.Exec(ctx, "INSERT INTO rejection (job_id, message_id, reason) VALUES ($1, $2, $3)", job.ID, job.Args.MessageID, err.Error())
	return err
}

func recordReceipt(ctx context.Context, tx pgx.Tx, job *river.Job[payArgs], started *engine.Started) error {
	_, err := tx.Exec(ctx, "INSERT INTO receipt (job_id, attempt, operation_id, created) VALUES ($1, $2, $3, $4)", job.ID, job.Attempt, started.ID, started.Created)
	return err
}

// config is the tests' worker configuration: it records rejections and receipts.
func config() *riverjob.Config[payArgs, payIn] {
	return &riverjob.Config[payArgs, payIn]{
		MessageFunc:  message,
		StartedFunc:  recordReceipt,
		RejectedFunc: recordRejection,
		Logger:       slog.New(slog.DiscardHandler),
	}
}

// quickRetry retries a failed job at once, so that a test sees its second
// attempt without River's backoff.
type quickRetry struct{}

func (quickRetry) NextRetry(*rivertype.JobRow) time.Time {
	return time.Now().Add(10 * time.Millisecond)
}

// clientConfig is the configuration of the consumer's River client, which works
// the queue of the messages, not the engine's.
func clientConfig(w river.Worker[payArgs]) *river.Config {
	workers := river.NewWorkers()
	river.AddWorker(workers, w)
	return &river.Config{
		Logger:            slog.New(slog.DiscardHandler),
		Queues:            map[string]river.QueueConfig{queue: {MaxWorkers: 10}},
		Workers:           workers,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		RetryPolicy:       quickRetry{},
	}
}

// startClient starts a River client on pool with cfg, stopped when t ends.
func startClient(t *testing.T, pool *pgxpool.Pool, cfg *river.Config) *river.Client[pgx.Tx] {
	t.Helper()
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	require.NoError(t, err)
	require.NoError(t, client.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, client.Stop(ctx))
	})
	return client
}

type bundle struct {
	pool   *pgxpool.Pool
	e      *engine.Engine
	op     *payOp
	client *river.Client[pgx.Tx]
}

// setup returns a database with the application's tables, an engine with its
// workers, and the consumer's River client with a worker of the tests' config,
// which mod, when not nil, changes.
func setup(t *testing.T, mod func(pool *pgxpool.Pool, cfg *riverjob.Config[payArgs, payIn])) *bundle {
	t.Helper()
	pool := idemflowtest.Pool(t, createSchema)
	op, err := newOperation()
	require.NoError(t, err)
	e := idemflowtest.Engine(t, pool, nil, op)
	cfg := config()
	if mod != nil {
		mod(pool, cfg)
	}
	w, err := riverjob.New(e, op, cfg)
	require.NoError(t, err)
	return &bundle{pool: pool, e: e, op: op, client: startClient(t, pool, clientConfig(w))}
}

// deliver inserts one job per message, in one statement, and returns their ids.
func (b *bundle) deliver(t *testing.T, msgs ...payArgs) []int64 {
	t.Helper()
	params := make([]river.InsertManyParams, len(msgs))
	for i, m := range msgs {
		params[i] = river.InsertManyParams{Args: m}
	}
	res, err := b.client.InsertMany(t.Context(), params)
	require.NoError(t, err)
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids
}

// job is a River job as the test reads it back.
type job struct {
	State    rivertype.JobState
	Attempt  int
	Errors   []string
	Metadata string
}

// output is the job's recorded output, a rejection's.
func (j job) output(t *testing.T) riverjob.Rejection {
	t.Helper()
	var md struct {
		Output riverjob.Rejection `json:"output"`
	}
	require.NoError(t, json.Unmarshal([]byte(j.Metadata), &md))
	return md.Output
}

func readJob(ctx context.Context, pool *pgxpool.Pool, id int64) (job, error) {
	var j job
	err := pool.QueryRow(ctx, `
		SELECT state, attempt, array(SELECT e->>'error' FROM unnest(errors) e), metadata::text
		FROM river_job WHERE id = $1`, id).Scan(&j.State, &j.Attempt, &j.Errors, &j.Metadata)
	return j, err
}

// waitUntil calls cond until it is true, for at most 30 seconds.
func waitUntil(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		require.NoError(t, err, what)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitJobs waits until the jobs are finalized (completed, cancelled or
// discarded) and returns them.
func waitJobs(t *testing.T, pool *pgxpool.Pool, ids ...int64) []job {
	t.Helper()
	var jobs []job
	waitUntil(t, fmt.Sprintf("jobs %v are finalized", ids), func() (bool, error) {
		jobs = jobs[:0]
		for _, id := range ids {
			j, err := readJob(t.Context(), pool, id)
			if err != nil {
				return false, err
			}
			switch j.State {
			case rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
				jobs = append(jobs, j)
			default:
				return false, nil
			}
		}
		return true, nil
	})
	return jobs
}

// finished waits for the operation of the message id and returns it.
func (b *bundle) finished(t *testing.T, id string) *engine.Info {
	t.Helper()
	return waitOperation(t, b.e, id)
}

func waitOperation(t *testing.T, e *engine.Engine, id string) *engine.Info {
	t.Helper()
	info, err := e.GetByKey(t.Context(), scope, id)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	info, err = e.Wait(ctx, info.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	return info
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), sql, args...).Scan(&n))
	return n
}

func bookings(t *testing.T, pool *pgxpool.Pool, id string) int {
	t.Helper()
	return count(t, pool, "SELECT count(*) FROM booking WHERE message_id = $1", id)
}
