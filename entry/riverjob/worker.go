package riverjob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemflow/idemflow/engine"
)

// Message is what a job asks for: an operation's input under the id that its
// producer gave the message.
type Message[In any] struct {
	// Scope is where the id is unique: the producer, the topic or the queue the
	// message came from. Ids of different scopes never meet. It is the engine's
	// scope (see engine.Start), so it must not be one that the application's
	// clients use for their own keys.
	Scope string
	// ID is the producer's id of the message, the same on every delivery of
	// it: the operation's idempotency key. Required: an empty ID is rejected.
	ID string
	// Input is the operation's input, built from the message's body only: a
	// field that differs between deliveries of one message (a delivery count, a
	// time of receipt) makes a redelivery look like another message under the
	// same id, which is rejected. Leave such fields out, or name them in the
	// operation's engine.OperationOpts.Unfingerprinted.
	Input In
}

// Config configures a Worker.
type Config[A river.JobArgs, In any] struct {
	// MessageFunc returns the message of a job. An error fails the job's
	// attempt, which River retries; wrap it with river.JobCancel for a job that
	// no retry can mend (then neither RejectedFunc nor the engine is asked).
	// Required.
	MessageFunc func(job *river.Job[A]) (Message[In], error)
	// StartedFunc, when set, runs in the job's transaction once the engine has
	// started the operation (started.Created) or found the one that an earlier
	// delivery started (started.Existing): what it writes in tx commits with the
	// operation's reservation and the job's completion, or not at all. An error
	// rolls all of them back and fails the job's attempt, which River retries
	// (wrap it with river.JobCancel to cancel the job instead).
	StartedFunc func(ctx context.Context, tx pgx.Tx, job *river.Job[A], started *engine.Started) error
	// RejectedFunc, when set, runs in the job's transaction when the engine
	// refuses the message for good: its id holds an operation started with
	// another input (a *engine.ReusedError, found with errors.As,
	// naming the fields that differ), or the id is empty (errors.Is
	// engine.ErrInvalidKey). What it writes in tx (the application's record of
	// the rejection) commits with the job's cancellation, once. An error rolls
	// both back and fails the job's attempt, which River retries, asking again.
	RejectedFunc func(ctx context.Context, tx pgx.Tx, job *river.Job[A], err error) error
	// Logger receives a warning for every rejected message. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Worker is a river.Worker that starts an operation for each job, keyed by the
// job's message id, and completes the job in the same transaction. Make one
// with New and register it on a River client with river.AddWorker. See the
// package documentation for what it guarantees.
type Worker[A river.JobArgs, In, S, Out any] struct {
	river.WorkerDefaults[A]

	e    *engine.Engine
	pool *pgxpool.Pool
	op   *engine.Operation[In, S, Out]
	cfg  Config[A, In]
}

// New returns a Worker that starts operations of type op on e, in
// transactions on e's pool (engine.Engine.Pool): register it on a River
// client of the same database, the engine's own (engine.RiverConfig.Workers)
// or the application's. cfg is copied; its MessageFunc is required.
//
// It returns an error when e, op or cfg is nil, when cfg is invalid, and when
// op was not given to e.
func New[A river.JobArgs, In, S, Out any](e *engine.Engine, op *engine.Operation[In, S, Out], cfg *Config[A, In]) (*Worker[A, In, S, Out], error) {
	switch {
	case e == nil:
		return nil, errors.New("riverjob: an engine is required")
	case op == nil:
		return nil, errors.New("riverjob: an operation type is required")
	case cfg == nil:
		return nil, errors.New("riverjob: a config is required")
	case !e.Registered(op):
		return nil, fmt.Errorf("riverjob: operation type not registered: %q", op.Name())
	case cfg.MessageFunc == nil:
		return nil, fmt.Errorf("riverjob: worker of %q: a message function is required", op.Name())
	}
	c := *cfg
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Worker[A, In, S, Out]{e: e, pool: e.Pool(), op: op, cfg: c}, nil
}

// Work starts the job's operation and completes the job, in one transaction:
// a job whose message id already holds an operation with the same input
// completes without starting another; one whose id holds an operation with
// another input is cancelled (never retried) and reported to
// Config.RejectedFunc. Any other failure rolls everything back and fails the
// attempt, which River retries.
func (w *Worker[A, In, S, Out]) Work(ctx context.Context, job *river.Job[A]) error {
	msg, err := w.cfg.MessageFunc(job)
	if err != nil {
		return fmt.Errorf("riverjob: message of job %d: %w", job.ID, err)
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("riverjob: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	started, err := engine.StartTx(ctx, tx, w.e, w.op, msg.Scope, msg.ID, msg.Input, nil)
	switch {
	case errors.As(err, new(*engine.ReusedError)), errors.Is(err, engine.ErrInvalidKey):
		return w.reject(ctx, tx, job, msg, err)
	case err != nil:
		return fmt.Errorf("riverjob: start %q for message %q: %w", w.op.Name(), msg.ID, err)
	}
	if w.cfg.StartedFunc != nil {
		if err := w.cfg.StartedFunc(ctx, tx, job, started); err != nil {
			return fmt.Errorf("riverjob: job %d started operation %s: %w", job.ID, started.ID, err)
		}
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return fmt.Errorf("riverjob: complete job %d: %w", job.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("riverjob: commit: %w", err)
	}
	return nil
}

// reject records the engine's refusal of msg and cancels the job, in tx: the
// cancellation (River's JobCancelTx, which River's rescuer honours for a job
// left running by a crash) and the job's output, which says why, commit with
// RejectedFunc's writes, so that a crash after the commit neither retries the
// job nor asks RejectedFunc again.
func (w *Worker[A, In, S, Out]) reject(ctx context.Context, tx pgx.Tx, job *river.Job[A], msg Message[In], cause error) error {
	rejected := fmt.Errorf("riverjob: message %q of scope %q rejected: %w", msg.ID, msg.Scope, cause)
	if w.cfg.RejectedFunc != nil {
		if err := w.cfg.RejectedFunc(ctx, tx, job, rejected); err != nil {
			return fmt.Errorf("riverjob: job %d rejected: %w", job.ID, err)
		}
	}
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return fmt.Errorf("riverjob: cancel job %d: %w", job.ID, err)
	}
	out := Rejection{Scope: msg.Scope, MessageID: msg.ID, Error: cause.Error()}
	var reused *engine.ReusedError
	if errors.As(cause, &reused) {
		out.OperationID, out.Fields = reused.Operation.String(), reused.Fields
	}
	if _, err := client.JobUpdateTx(ctx, tx, job.ID, &river.JobUpdateParams{Output: out}); err != nil {
		return fmt.Errorf("riverjob: record the rejection of job %d: %w", job.ID, err)
	}
	if _, err := client.JobCancelTx(ctx, tx, job.ID); err != nil {
		return fmt.Errorf("riverjob: cancel job %d: %w", job.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("riverjob: commit the rejection of job %d: %w", job.ID, err)
	}
	w.cfg.Logger.WarnContext(ctx, "riverjob: message rejected, job cancelled",
		slog.String("operation", w.op.Name()), slog.String("scope", msg.Scope), slog.String("key", msg.ID),
		slog.Int64("job_id", job.ID), slog.String("kind", job.Kind), slog.String("error", cause.Error()))
	return river.JobCancel(rejected)
}

// Rejection is the output (River's rivertype.MetadataKeyOutput) of a job whose
// message the engine refused: why it was cancelled, as River shows it. River's
// own record of the attempt's error may be "job cancelled remotely": the
// cancellation commits with the rejection, and River may see it before the
// worker returns.
type Rejection struct {
	Scope     string `json:"scope"`
	MessageID string `json:"message_id"`
	// OperationID is the operation that holds the message id, and Fields the
	// top-level fields of the input that differ from its; both empty for an
	// empty message id.
	OperationID string   `json:"operation_id,omitempty"`
	Fields      []string `json:"fields,omitempty"`
	// Error is the engine's error.
	Error string `json:"error"`
}
