package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// resumeArgs is the River job that carries an operation on: after a backoff, after
// a crash (the sweeper enqueues it), or when the operation was started in a
// transaction.
type resumeArgs struct {
	OperationID uuid.UUID `json:"operation_id"`
	Operation   string    `json:"operation"`
	// Recovery is true for the sweeper's job: the run before it stopped
	// renewing its lease.
	Recovery bool `json:"recovery,omitempty"`
	// Scope is the operation's, when the job's maker knew it: a resume of a
	// scope over its share (Config.MaxInFlightPerScope) waits.
	Scope string `json:"scope,omitempty"`
}

// Kind implements river.JobArgs.
func (resumeArgs) Kind() string { return "idemflow_resume" }

type resumeWorker struct {
	river.WorkerDefaults[resumeArgs]
	e *Engine
}

// Work claims the operation and runs what is left of it. An operation that is
// finished, or held by a live run, needs nothing from this job.
//
// A job of a scope that has Config.MaxInFlightPerScope runs here already is
// put back (snoozed, which uses up no attempt), so that the jobs of other
// scopes go first. So is a job that this process cannot run because a newer
// build migrated the database with a migration that its statements do not fit
// (see Engine.Health): a process of that build takes it.
func (w *resumeWorker) Work(ctx context.Context, job *river.Job[resumeArgs]) error {
	if w.e.schemaRefusal(ctx) != nil {
		return river.JobSnooze(schemaRecheck)
	}
	scope, max := job.Args.Scope, w.e.cfg.MaxInFlightPerScope
	var place *room
	if scope != "" {
		if !w.e.scopes.enter(scope, max) {
			return river.JobSnooze(scopeSnooze)
		}
		place = &room{leave: func() { w.e.scopes.leave(scope, max) }}
		defer place.giveBack() // when no run took it over
	}
	err := w.e.resume(ctx, job.Args.OperationID, job.Args.Operation, job.Args.Recovery, place)
	if w.e.schemaFault(ctx, err) != nil {
		return river.JobSnooze(schemaRecheck)
	}
	return err
}

// enqueueResume inserts, in tx, the River job that carries the operation
// on: at once, or at at when it is not zero. Every resume job the engine
// makes outside a sweep (handToWorkers batches those) is made here.
func (e *Engine) enqueueResume(ctx context.Context, tx pgx.Tx, args resumeArgs, at time.Time) error {
	_, err := e.river.InsertTx(ctx, tx, args, &river.InsertOpts{Queue: e.cfg.River.Queue, ScheduledAt: at})
	return err
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
	var lastNoticed time.Time
	for {
		if err := e.Sweep(ctx); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "sweep failed; trying again at the next", slog.Any("error", err))
		}
		if time.Since(lastNoticed) >= e.cfg.Lease {
			lastNoticed = time.Now()
			e.noticeOtherVersions(ctx)
			if err := e.heartbeat(ctx); err != nil && ctx.Err() == nil {
				e.logger.WarnContext(ctx, "could not refresh this process for operators", slog.Any("error", err))
			}
		}
		if err := e.serveOperators(ctx); err != nil && ctx.Err() == nil {
			e.logger.WarnContext(ctx, "could not serve operators' requests; trying again at the next sweep", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// noticeOtherVersions, which the sweeper calls once a lease, logs, once each, the expired operations of the names
// this process runs whose version it does not run: it leaves them alone, and
// says so.
func (e *Engine) noticeOtherVersions(ctx context.Context) {
	for name, versions := range e.versions {
		others, err := e.store.OperationListOtherVersions(ctx, e.control, name, versions, sweepBatch)
		if err != nil {
			if ctx.Err() == nil {
				e.logger.WarnContext(ctx, "could not look for operations of other versions", slog.String("operation", name), slog.Any("error", err))
			}
			continue // the other names still get their look
		}
		for _, op := range others {
			e.logWaiting(ctx, op.ID, op.Name, op.Version)
		}
	}
}

// Sweep hands every operation whose lease expired (its run crashed, or its River
// job was lost) to a resume job, and returns when they are enqueued. Each process
// with started workers calls it every SweepInterval; tests and operators may too.
//
// It sweeps the definitions that this process runs only, each in one indexed
// range: an operation of a version that no definition here has is not touched,
// however long it waits.
func (e *Engine) Sweep(ctx context.Context) error {
	var expired []store.ExpiredOperation
	for _, k := range e.defKeys() {
		found, err := e.store.OperationListExpired(ctx, e.control, k.name, k.version, sweepBatch, nil)
		if err != nil {
			return fmt.Errorf("engine: sweep: %w", err)
		}
		expired = append(expired, found...)
	}
	resumes := make([]handedResume, len(expired))
	for i, op := range expired {
		resumes[i] = handedResume{args: resumeArgs{OperationID: op.ID, Operation: op.Name, Recovery: true, Scope: op.Scope},
			take: func(tx pgx.Tx) (bool, error) { return e.store.OperationExtendExpired(ctx, tx, op.ID, e.cfg.Lease, nil) }}
	}
	if err := e.handToWorkers(ctx, resumes, "lease expired; resuming operation"); err != nil {
		return fmt.Errorf("engine: sweep: %w", err)
	}
	return nil
}

// handedResume is an operation that a sweep or a takeover hands to a resume
// job: take takes it in the job's transaction (false: another process did).
type handedResume struct {
	args resumeArgs
	take func(tx pgx.Tx) (bool, error)
}

// handToWorkers takes the operations and queues their resume jobs, all in one
// transaction: one commit, so one River insert notification, on which a
// producer fetches them all at once (notifications after the first within
// River's fetch cooldown are dropped, and a job left to River's next poll
// waits a second). Each operation handed over is logged with why.
func (e *Engine) handToWorkers(ctx context.Context, resumes []handedResume, why string) error {
	if len(resumes) == 0 {
		return nil
	}
	tx, err := e.control.Begin(ctx)
	if err != nil {
		return err
	}
	defer rollback(ctx, tx)
	var jobs []river.InsertManyParams
	for _, r := range resumes {
		ok, err := r.take(tx)
		if err != nil {
			return err
		}
		if ok {
			jobs = append(jobs, river.InsertManyParams{Args: r.args, InsertOpts: &river.InsertOpts{Queue: e.cfg.River.Queue}})
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	if _, err := e.river.InsertManyTx(ctx, tx, jobs); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	for _, j := range jobs {
		a := j.Args.(resumeArgs)
		e.logger.InfoContext(ctx, why, slog.String("operation_id", a.OperationID.String()), slog.String("operation", a.Operation))
	}
	return nil
}

// resume claims an operation and runs it from its first unfinished step.
// recovery says that the run before it stopped renewing its lease.
func (e *Engine) resume(ctx context.Context, id uuid.UUID, name string, recovery bool, place *room) error {
	_, err := e.claimAndRun(ctx, id, name, nil, recovery, place)
	switch {
	case err == nil, errors.Is(err, errHandedOff), errors.Is(err, errLost), errors.Is(err, errNotClaimed),
		errors.Is(err, errParked), errors.Is(err, errWaiting), errors.Is(err, errVersionNotRun):
		// errVersionNotRun: the job ends; the operation's lease runs out, and
		// the sweeper of a process that runs its version takes it.
		return nil
	default:
		return err
	}
}
