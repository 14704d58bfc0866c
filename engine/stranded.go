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
	// loop starts rescueLoop once: with the workers, or, in a process that
	// runs none (one that only starts operations), at its first stranded run.
	loop sync.Once
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
	e.startRescue(false)
}

// startRescue starts rescueLoop, once, until the engine stops. StartWorkers
// starts it with the sweeps, which Stop waits for (wait true); a process
// without workers starts it at its first stranded run, and Stop ends it
// with the engine's context.
func (e *Engine) startRescue(wait bool) {
	e.stranded.loop.Do(func() {
		if wait {
			e.sweeps.Add(1)
		}
		go func() {
			if wait {
				defer e.sweeps.Done()
			}
			e.rescueLoop(e.baseCtx)
		}()
	})
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
