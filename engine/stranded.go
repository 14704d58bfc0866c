package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// stranded holds the operations whose run in this process stopped because
// the database did not answer (a failover, a restart): their lease still
// names the run. Rather than leave each to wait out its lease, this process
// hands them back to resume jobs as soon as the database answers again
// (rescueLoop): the run is its own, so nobody else's work is taken.
type stranded struct {
	mu   sync.Mutex
	runs map[uuid.UUID]strandedRun
	// started says rescueLoop runs (startRescue), and stopped that the
	// engine stops: no loop starts any more. loop is the running one, which
	// Stop waits for.
	started, stopped bool
	loop             sync.WaitGroup
}

// strandedRun is a run that stopped with the database away.
type strandedRun struct {
	runID uuid.UUID
	args  resumeArgs
	// interrupted says that the run may have stopped in the middle of a call
	// out (calls_until); not a first attempt whose reservation was not
	// confirmed, which had called nothing.
	interrupted bool
}

// strand notes that r stopped with the database away, holding its
// operation's lease (or maybe holding it: a first attempt whose
// reservation's answer was lost, interrupted false).
func (e *Engine) strand(r *run, interrupted bool) {
	e.stranded.mu.Lock()
	defer e.stranded.mu.Unlock()
	if e.stranded.runs == nil {
		e.stranded.runs = make(map[uuid.UUID]strandedRun)
	}
	e.stranded.runs[r.id] = strandedRun{runID: r.runID, args: resumeArgs{OperationID: r.id, Operation: r.def.name, Scope: r.scope},
		interrupted: interrupted}
	e.startRescue()
}

// startRescue starts rescueLoop, once, unless the engine stops, with
// e.stranded.mu held: StartWorkers starts it, and a process without workers
// (one that only starts operations) at its first stranded run.
func (e *Engine) startRescue() {
	if e.stranded.started || e.stranded.stopped {
		return
	}
	e.stranded.started = true
	e.stranded.loop.Add(1)
	go func() {
		defer e.stranded.loop.Done()
		e.rescueLoop(e.baseCtx)
	}()
}

// stopRescue waits for rescueLoop to end (the engine's context ended), and
// keeps another from starting.
func (e *Engine) stopRescue() {
	e.stranded.mu.Lock()
	e.stranded.stopped = true
	e.stranded.mu.Unlock()
	e.stranded.loop.Wait()
}

// rescueInterval is how often the stranded runs are handed back while the
// database does not answer; nothing is sent while there are none.
const rescueInterval = 100 * time.Millisecond

// rescueLoop hands the stranded runs' operations back to resume jobs once
// the database answers, until ctx ends.
func (e *Engine) rescueLoop(ctx context.Context) {
	t := time.NewTicker(rescueInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.stranded.mu.Lock()
		runs := make(map[uuid.UUID]strandedRun, len(e.stranded.runs))
		for id, s := range e.stranded.runs {
			runs[id] = s
		}
		e.stranded.mu.Unlock()
		for id, s := range runs {
			if err := e.rescue(ctx, id, s); err != nil {
				break // the database is still away: all of them wait for the next tick
			}
			e.stranded.mu.Lock()
			if cur, ok := e.stranded.runs[id]; ok && cur.runID == s.runID {
				delete(e.stranded.runs, id)
			}
			e.stranded.mu.Unlock()
		}
	}
}

// rescue hands the operation that a stranded run holds back to a resume job,
// in one transaction, unless the run no longer holds it (another took it
// over, or it ended, or its reservation never committed): like a run stopped
// with the engine, it may have been calling out until then (calls_until),
// unless it was not interrupted.
func (e *Engine) rescue(ctx context.Context, id uuid.UUID, s strandedRun) error {
	ctx, cancel := context.WithTimeout(ctx, max(e.cfg.Lease/3, time.Second))
	defer cancel()
	return pgx.BeginFunc(ctx, e.control, func(tx pgx.Tx) error {
		_, ok, err := e.store.OperationRelease(ctx, tx, id, s.runID, 0, e.cfg.Lease, s.interrupted)
		if err != nil || !ok {
			return err
		}
		if err := e.enqueueResume(ctx, tx, s.args, time.Time{}); err != nil {
			return err
		}
		e.logger.InfoContext(ctx, "the database answers again: the operation whose run stopped without it resumes now, not when its lease ends",
			slog.String("operation_id", id.String()), slog.String("operation", s.args.Operation))
		return nil
	})
}
