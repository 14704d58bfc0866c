package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// resumeArgs is the River job that carries an operation on: after a backoff, after
// a crash (the sweeper enqueues it), or when the operation was started in a
// transaction.
type resumeArgs struct {
	OperationID uuid.UUID `json:"operation_id"`
	Operation   string    `json:"operation"`
}

// Kind implements river.JobArgs.
func (resumeArgs) Kind() string { return "idemflow_resume" }

type resumeWorker struct {
	river.WorkerDefaults[resumeArgs]
	e *Engine
}

// Work claims the operation and runs what is left of it. An operation that is
// finished, or held by a live run, needs nothing from this job.
func (w *resumeWorker) Work(ctx context.Context, job *river.Job[resumeArgs]) error {
	return w.e.resume(ctx, job.Args.OperationID, job.Args.Operation)
}

// sweepBatch bounds the operations one sweep hands to workers.
const sweepBatch = 100

// sweepLoop sweeps every SweepInterval until ctx ends. Every process with started
// workers sweeps, rather than River's elected leader only: when the leader is the
// process that crashed, River takes up to 20 seconds to elect another, and the
// crashed process's operations would wait that long. Sweeps in several processes
// are safe: one conditional update hands an operation to one job.
func (e *Engine) sweepLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.SweepInterval)
	defer t.Stop()
	for {
		if err := e.Sweep(ctx); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "sweep failed; trying again at the next", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep hands every operation whose lease expired (its run crashed, or its River
// job was lost) to a resume job, and returns when they are enqueued. Each process
// with started workers calls it every SweepInterval; tests and operators may too.
func (e *Engine) Sweep(ctx context.Context) error {
	expired, err := e.store.OperationListExpired(ctx, e.pool, sweepBatch, nil)
	if err != nil {
		return fmt.Errorf("engine: sweep: %w", err)
	}
	for _, op := range expired {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("engine: sweep: %w", err)
		}
		ok, err := e.store.OperationExtendExpired(ctx, tx, op.ID, e.cfg.Lease, nil)
		if err == nil && ok {
			_, err = e.river.InsertTx(ctx, tx, resumeArgs{OperationID: op.ID, Operation: op.Name}, &river.InsertOpts{Queue: e.cfg.Queue})
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		rollback(ctx, tx)
		if err != nil {
			return fmt.Errorf("engine: sweep: %w", err)
		}
		if ok {
			e.logger.InfoContext(ctx, "lease expired; resuming operation",
				slog.String("operation_id", op.ID.String()), slog.String("operation", op.Name))
		}
	}
	return nil
}

// resume claims an operation and runs it from its first unfinished step.
func (e *Engine) resume(ctx context.Context, id uuid.UUID, name string) error {
	_, err := e.claimAndRun(ctx, id, name, nil)
	switch {
	case err == nil, errors.Is(err, errHandedOff), errors.Is(err, errLost), errors.Is(err, errNotClaimed):
		return nil
	default:
		return err
	}
}

// errNotClaimed: the operation is finished, or a live run holds it.
var errNotClaimed = errors.New("operation not claimed")

// claimAndRun claims an operation and runs what is left of it; with cancel, it
// ends the operation failed with that error instead, after compensating.
func (e *Engine) claimAndRun(ctx context.Context, id uuid.UUID, name string, cancelWith *PermanentError) (*Info, error) {
	def := e.defs[name]
	if def == nil {
		// Another process may know the type; River retries the job.
		return nil, fmt.Errorf("engine: run %s: %w: %q", id, ErrNotRegistered, name)
	}
	if !e.addRun() {
		return nil, ErrStopped
	}
	defer e.runs.Done()
	runID := uuid.New()
	rec, err := e.store.OperationClaim(ctx, e.pool, id, runID, e.cfg.Lease)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNotClaimed
	}
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	recorded, err := e.store.StepListByOperation(ctx, e.pool, id)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	r := &run{
		e:        e,
		def:      def,
		id:       id,
		runID:    runID,
		scope:    rec.Scope,
		key:      rec.Key,
		status:   make(map[string]store.StepState, len(rec.Steps)),
		tries:    make(map[string]int, len(rec.Steps)),
		resumed:  true,
		reserved: true,
		runs:     rec.Runs,
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.cancelRun = cancel
	stopLease := r.keepLease(ctx)
	defer stopLease()

	info, err := r.load(ctx, rec, recorded)
	if err == nil && info == nil {
		if cancelWith != nil && r.failure == nil {
			r.logger().InfoContext(ctx, "cancelling operation", slog.Int("run", rec.Runs))
			r.failure = cancelWith
		} else {
			r.logger().InfoContext(ctx, "resuming operation", slog.Int("run", rec.Runs))
		}
		info, err = r.runSteps(context.WithValue(ctx, operationIDKey{}, id))
	}
	r.end(ctx, info, err)
	return info, err
}

// load restores a run from the operation's records. It ends the operation failed
// at once when this process's definition lacks a step the operation still needs.
func (r *run) load(ctx context.Context, rec *store.Operation, recorded []store.Step) (*Info, error) {
	in, err := r.def.decodeInput(rec.Input)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	r.in = in
	lastPos := -1
	for _, s := range recorded {
		r.status[s.Name] = s.State
		r.tries[s.Name] = s.Attempts
		if (s.State == store.StepSucceeded || s.State == store.StepCompensated) && s.Position > lastPos {
			lastPos = s.Position
			r.stateRaw = s.Output
		}
		if s.State == store.StepFailed {
			r.failure = &PermanentError{Code: "step_failed", Message: s.LastError, Step: s.Name}
		}
	}
	if r.failure != nil && len(rec.Error) > 0 {
		pe := &PermanentError{}
		if json.Unmarshal(rec.Error, pe) == nil {
			r.failure = pe
		}
	}
	if err := r.restoreState(); err != nil {
		return nil, err
	}

	var missing []string
	for _, name := range rec.Steps {
		i, ok := r.def.index[name]
		if !ok {
			st := r.status[name]
			if st != store.StepSucceeded && st != store.StepCompensated || r.failure != nil && st == store.StepSucceeded {
				missing = append(missing, name)
			}
			r.steps = append(r.steps, nil)
			continue
		}
		r.steps = append(r.steps, r.def.steps[i])
	}
	if len(missing) == 0 {
		return nil, nil
	}
	verr := &VersionError{Operation: r.def.name, Started: rec.Steps, Registered: r.def.stepNames(), Missing: missing}
	r.logger().ErrorContext(ctx, "cannot resume operation", slog.Any("error", verr))
	r.failure = &PermanentError{Code: CodeDefinitionChanged, Message: verr.Error()}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	return r.commitFailure(ctx, tx)
}
