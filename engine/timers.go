package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// timers is what keeps the moments of waits (a TimerStep's, a deadline) in
// this process: a loop that sleeps until the earliest one of the
// definitions it runs and hands what is due to its workers (see timerLoop).
type timers struct {
	// poke tells the loop that this process handed back an operation due
	// at a moment, which may be earlier than the one it sleeps until.
	poke chan time.Time
}

func newTimers() timers { return timers{poke: make(chan time.Time, 1)} }

// soon tells the timer loop of a moment an operation is due at.
func (t *timers) soon(at time.Time) {
	select {
	case t.poke <- at:
	default: // the loop reads the earliest moment anew anyway
	}
}

// waits reports whether a definition of this process has a step that waits
// for a signal, a moment or approvals: only then can one of its operations be
// due at a moment, and the timer loop has something to keep.
func (e *Engine) waits() bool {
	for _, d := range e.defs {
		for _, st := range d.steps {
			if st.kind == StepKindWait {
				return true
			}
		}
	}
	return false
}

// timerLoop hands the operations whose wait has ended to resume jobs, within
// about a second of their moment, until ctx ends. It reads the earliest
// moment of the definitions this process runs (one probe of an index,
// however many operations wait) and sleeps until it, or for SweepInterval
// at most, so that a moment that another process set is read in time too;
// a wait that this process hands back wakes it at once. Loops in several
// processes are safe: one conditional update hands an operation to one job,
// and a run decides a wait once (see runWaitStep).
func (e *Engine) timerLoop(ctx context.Context) {
	defs := e.definitionNames()
	for {
		sleep := e.cfg.SweepInterval
		at, ok, now, err := e.store.OperationNextWake(ctx, e.control, defs)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				e.logger.WarnContext(ctx, "could not read when the next wait ends; trying again", slog.Any("error", err))
			}
		case ok && !at.After(now):
			if err := e.wakeDue(ctx, defs); err != nil {
				if ctx.Err() == nil {
					e.logger.WarnContext(ctx, "could not hand the operations whose wait ended to workers; trying again", slog.Any("error", err))
				}
			} else {
				continue
			}
		case ok:
			sleep = min(sleep, at.Sub(now))
		}
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-e.timers.poke:
			t.Stop()
		}
	}
}

// wakeDue hands the operations whose wait has ended to resume jobs, in
// batches, until none is left.
func (e *Engine) wakeDue(ctx context.Context, defs []string) error {
	due, err := e.store.OperationListDue(ctx, e.control, defs, sweepBatch)
	if err != nil {
		return err
	}
	resumes := make([]handedResume, len(due))
	for i, op := range due {
		resumes[i] = handedResume{args: resumeArgs{OperationID: op.ID, Operation: op.Name, Scope: op.Scope},
			take: func(tx pgx.Tx) (bool, error) { return e.store.OperationTakeDue(ctx, tx, op.ID, e.cfg.Lease) }}
	}
	return e.handToWorkers(ctx, resumes, "its wait ended; resuming operation")
}
