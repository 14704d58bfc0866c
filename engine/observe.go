package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/reconcile"
)

// Observer is told what the engine does in this process, for metrics and
// traces (Config.Observer). Every field is optional. The functions run on the
// engine's hot path, in the goroutine of the run: keep them short, and never
// block in them.
type Observer struct {
	// OperationStarted: an operation's first attempt starts here: after its
	// reservation by Start, or, for one reserved in the caller's transaction
	// (StartTx), as the River job that runs it first claims it (so a
	// transaction rolled back counts nothing).
	OperationStarted func(ctx context.Context, op OperationEvent)
	// OperationFinished: an operation ended here, succeeded or failed. For a
	// first attempt it is called before Started.Wait returns the operation, so
	// that an answer given from Wait is counted already.
	OperationFinished func(ctx context.Context, op OperationEvent, status Status)
	// OperationRecovered: this process took an operation over after another
	// run's lease expired (the sweeper's resume).
	OperationRecovered func(ctx context.Context, op OperationEvent)
	// StepAttempted: an attempt of a step ended here.
	StepAttempted func(ctx context.Context, step StepEvent)
	// LookedUp: a lookup asked, by derived key, whether an earlier attempt of
	// an external step went through.
	LookedUp func(ctx context.Context, step StepEvent, found bool)

	// RunStarted: a run of the operation begins here (its first attempt, or a
	// resume). The context it returns (a span's, say) is the run's: its
	// steps, and the rest of the Observer's calls for the run, get it.
	RunStarted func(ctx context.Context, op OperationEvent, resumed bool) context.Context
	// RunEnded: the run ends, as end says. Only RunFailed is a failure of
	// the run's own (a lost lease, a database error); err says why the run
	// stopped, and is nil for RunFinished.
	RunEnded func(ctx context.Context, op OperationEvent, end RunEnd, err error)
	// StepStarted: an attempt of a step begins. The context it returns is the
	// attempt's: the step's function gets it (an HTTP call made with it
	// carries a span's context), and StepAttempted ends the attempt with it.
	StepStarted func(ctx context.Context, step StepEvent) context.Context
	// OperatorRequested: this process carried out, or refused, an operator's
	// request (Retry, Cancel, Resolve, Approve, Reject): action is one of the
	// Action constants, result "done", "refused" or "failed".
	OperatorRequested func(ctx context.Context, action Action, result string)
	// Waited: a step that waited for a signal, a moment or approvals
	// (reason) was decided here, after waiting for waited, by the
	// database's clock, from the moment it was reached.
	Waited func(ctx context.Context, step StepEvent, reason WaitReason, waited time.Duration)
	// Reconciled: a reconciliation run of a source ended here; counts are
	// the mismatches of each kind now (as Engine.MismatchCounts), so that a
	// gauge shows a run's findings at once.
	Reconciled func(ctx context.Context, source string, counts map[reconcile.Kind]int64)
	// CommitGrouped: transactions of size runs, ready at the same moment,
	// were sent in one round trip to commit together (Config.GroupCommit).
	// split says that one of them failed, so that none committed and each
	// was sent again alone.
	CommitGrouped func(ctx context.Context, size int, split bool)
}

// Observers combines observers into one that tells each, in order; nil ones
// are left out.
func Observers(obs ...*Observer) *Observer {
	var list []*Observer
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	if len(list) == 1 {
		return list[0]
	}
	return &Observer{
		OperationStarted: func(ctx context.Context, op OperationEvent) {
			for _, o := range list {
				if o.OperationStarted != nil {
					o.OperationStarted(ctx, op)
				}
			}
		},
		OperationFinished: func(ctx context.Context, op OperationEvent, s Status) {
			for _, o := range list {
				if o.OperationFinished != nil {
					o.OperationFinished(ctx, op, s)
				}
			}
		},
		OperationRecovered: func(ctx context.Context, op OperationEvent) {
			for _, o := range list {
				if o.OperationRecovered != nil {
					o.OperationRecovered(ctx, op)
				}
			}
		},
		StepAttempted: func(ctx context.Context, s StepEvent) {
			for _, o := range list {
				if o.StepAttempted != nil {
					o.StepAttempted(ctx, s)
				}
			}
		},
		LookedUp: func(ctx context.Context, s StepEvent, found bool) {
			for _, o := range list {
				if o.LookedUp != nil {
					o.LookedUp(ctx, s, found)
				}
			}
		},
		Waited: func(ctx context.Context, s StepEvent, reason WaitReason, waited time.Duration) {
			for _, o := range list {
				if o.Waited != nil {
					o.Waited(ctx, s, reason, waited)
				}
			}
		},
		RunStarted: func(ctx context.Context, op OperationEvent, resumed bool) context.Context {
			for _, o := range list {
				if o.RunStarted != nil {
					ctx = o.RunStarted(ctx, op, resumed)
				}
			}
			return ctx
		},
		RunEnded: func(ctx context.Context, op OperationEvent, end RunEnd, err error) {
			for _, o := range list {
				if o.RunEnded != nil {
					o.RunEnded(ctx, op, end, err)
				}
			}
		},
		StepStarted: func(ctx context.Context, s StepEvent) context.Context {
			for _, o := range list {
				if o.StepStarted != nil {
					ctx = o.StepStarted(ctx, s)
				}
			}
			return ctx
		},
		OperatorRequested: func(ctx context.Context, action Action, result string) {
			for _, o := range list {
				if o.OperatorRequested != nil {
					o.OperatorRequested(ctx, action, result)
				}
			}
		},
		Reconciled: func(ctx context.Context, source string, counts map[reconcile.Kind]int64) {
			for _, o := range list {
				if o.Reconciled != nil {
					o.Reconciled(ctx, source, counts)
				}
			}
		},
		CommitGrouped: func(ctx context.Context, size int, split bool) {
			for _, o := range list {
				if o.CommitGrouped != nil {
					o.CommitGrouped(ctx, size, split)
				}
			}
		},
	}
}

// observeGroup tells the observer of a group commit sent, containing its
// panic.
func (e *Engine) observeGroup(size int, split bool) {
	obs := e.cfg.Observer
	if obs == nil || obs.CommitGrouped == nil {
		return
	}
	ctx := context.Background()
	defer func() {
		if v := recover(); v != nil {
			e.logger.ErrorContext(ctx, "observer panicked; ignored", slog.String("call", "CommitGrouped"), slog.Any("panic", v))
		}
	}()
	obs.CommitGrouped(ctx, size, split)
}

// startRun tells the observer that the run begins, and returns its context.
func (r *run) startRun(ctx context.Context) context.Context {
	if obs := r.e.cfg.Observer; obs != nil && obs.RunStarted != nil {
		return r.observedCtx(ctx, "RunStarted", func() context.Context { return obs.RunStarted(ctx, r.opEvent(), r.resumed) })
	}
	return ctx
}

func (r *run) endRun(ctx context.Context, err error) {
	if obs := r.e.cfg.Observer; obs != nil && obs.RunEnded != nil {
		r.observed(ctx, "RunEnded", func() { obs.RunEnded(ctx, r.opEvent(), runEndOf(err), err) })
	}
}

// RunEnd is how a run of an operation ended (Observer.RunEnded). Only
// RunFailed is a failure: in the others the operation finished, or another
// run, a retry or an operator carries it on.
type RunEnd string

// The ends of a run.
const (
	// RunFinished: the run finished the operation, succeeded or failed.
	RunFinished RunEnd = "finished"
	// RunHandedOff: it scheduled a River job to carry the operation on after
	// a backoff, or handed it back as it was.
	RunHandedOff RunEnd = "handed_off"
	// RunParked: it parked the operation for an operator.
	RunParked RunEnd = "parked"
	// RunKeyTaken: a first attempt whose reservation found the key already
	// taken (Start returns that operation).
	RunKeyTaken RunEnd = "key_taken"
	// RunWaiting: this process's definition lacks a step the operation needs;
	// it waits for a process that has it.
	RunWaiting RunEnd = "waiting"
	// RunStopped: the engine stopped (Stop) while the run was under way; the
	// operation is handed back.
	RunStopped RunEnd = "stopped"
	// RunFailed: the run failed itself (a lost lease, a database error).
	RunFailed RunEnd = "failed"
)

func runEndOf(err error) RunEnd {
	switch {
	case err == nil:
		return RunFinished
	case errors.Is(err, errHandedOff):
		return RunHandedOff
	case errors.Is(err, errParked):
		return RunParked
	case errors.Is(err, errKeyTaken):
		return RunKeyTaken
	case errors.Is(err, errWaiting):
		return RunWaiting
	case errors.Is(err, context.Canceled):
		return RunStopped
	}
	return RunFailed
}

// startStep tells the observer that attempt of st begins, and returns the
// attempt's context.
func (r *run) startStep(ctx context.Context, st *stepDef, attempt int) context.Context {
	if obs := r.e.cfg.Observer; obs != nil && obs.StepStarted != nil {
		return r.observedCtx(ctx, "StepStarted", func() context.Context {
			return obs.StepStarted(ctx, StepEvent{Operation: r.opEvent(), Step: st.name, Attempt: attempt, Key: r.attempt(st, attempt).Key})
		})
	}
	return ctx
}

// OperationEvent names the operation an Observer is told about.
type OperationEvent struct {
	ID uuid.UUID
	// Name and Version are its definition's.
	Name    string
	Version int
}

// AttemptEnd is how a step's attempt ended.
type AttemptEnd string

// The outcomes of a step's attempt.
const (
	// AttemptSucceeded: the attempt succeeded (by its own call, or found by a
	// lookup).
	AttemptSucceeded AttemptEnd = "succeeded"
	// AttemptRetried: it failed transiently; another attempt follows.
	AttemptRetried AttemptEnd = "retried"
	// AttemptAccepted: the outside service accepted the call (or its lookup found
	// it still being processed) and gives its outcome later: the step waits
	// for it. Not a failure: a healthy service may answer pending for a
	// while.
	AttemptAccepted AttemptEnd = "pending"
	// AttemptFailed: it failed for good (the operation fails, or is parked).
	AttemptFailed AttemptEnd = "failed"
	// AttemptPanicked: it panicked (and is retried as a transient failure).
	AttemptPanicked AttemptEnd = "panicked"
)

// StepEvent describes an attempt of a step.
type StepEvent struct {
	Operation OperationEvent
	Step      string
	// Attempt counts the step's attempts, from 1.
	Attempt int
	// Key is the step's derived idempotency key (see Attempt.Key).
	Key string
	// Outcome and Duration are set for StepAttempted, and Err, for an attempt
	// that did not succeed, is why (for operators: it may name internals).
	Outcome  AttemptEnd
	Duration time.Duration
	Err      error
}

func (r *run) opEvent() OperationEvent {
	return OperationEvent{ID: r.id, Name: r.def.name, Version: r.def.version}
}

// observeStep tells the observer that an attempt of st, begun at started,
// ended with outcome (AttemptPanicked instead when err is a panic).
func (r *run) observeStep(ctx context.Context, st *stepDef, attempt int, started time.Time, outcome AttemptEnd, err error) {
	obs := r.e.cfg.Observer
	if obs == nil || obs.StepAttempted == nil {
		return
	}
	if pan := (*panicError)(nil); errors.As(err, &pan) {
		outcome = AttemptPanicked
	}
	ev := StepEvent{Operation: r.opEvent(), Step: st.name, Attempt: attempt, Key: r.attempt(st, attempt).Key,
		Outcome: outcome, Duration: time.Since(started), Err: err}
	r.observed(ctx, "StepAttempted", func() { obs.StepAttempted(ctx, ev) })
}

func (r *run) observeLookup(ctx context.Context, st *stepDef, attempt int, found bool) {
	if obs := r.e.cfg.Observer; obs != nil && obs.LookedUp != nil {
		ev := StepEvent{Operation: r.opEvent(), Step: st.name, Attempt: attempt, Key: r.attempt(st, attempt).Key}
		r.observed(ctx, "LookedUp", func() { obs.LookedUp(ctx, ev, found) })
	}
}

func (r *run) observeStarted(ctx context.Context) {
	if obs := r.e.cfg.Observer; obs != nil && obs.OperationStarted != nil {
		r.observed(ctx, "OperationStarted", func() { obs.OperationStarted(ctx, r.opEvent()) })
	}
}

func (r *run) observeFinished(ctx context.Context, status Status) {
	if obs := r.e.cfg.Observer; obs != nil && obs.OperationFinished != nil {
		r.observed(ctx, "OperationFinished", func() { obs.OperationFinished(ctx, r.opEvent(), status) })
	}
}

func (r *run) observeRecovered(ctx context.Context) {
	if obs := r.e.cfg.Observer; obs != nil && obs.OperationRecovered != nil {
		r.observed(ctx, "OperationRecovered", func() { obs.OperationRecovered(ctx, r.opEvent()) })
	}
}

// InProgress is, for one operation type and version, how many of its
// operations are in progress in the database and how old the oldest is.
type InProgress struct {
	Name    string
	Version int
	// Runnable is true when this process runs the version; false for
	// operations that wait for a process that does.
	Runnable bool
	Count    int64
	// NeedingAttention counts those that need attention (Info.NeedsAttention);
	// Waiting those that wait with no process busy on them, by what they
	// wait for (a step in StepStatusWaiting); a reason with none is absent.
	NeedingAttention int64
	Waiting          map[WaitReason]int64
	Oldest           time.Duration
}

// InProgress reads, in one scan of an index of unfinished operations, how many
// operations of each type and version are in progress and the age of the
// oldest, by the database's clock: what
// gauges of unfinished operations read on a timer (never per request). Types
// with none are absent.
func (e *Engine) InProgress(ctx context.Context) ([]InProgress, error) {
	stats, err := e.store.OperationInProgressStats(ctx, e.control)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([]InProgress, len(stats))
	for i, s := range stats {
		out[i] = InProgress{Name: s.Name, Version: s.Version, Runnable: e.def(s.Name, s.Version) != nil,
			Count: s.InProgress, NeedingAttention: s.NeedingAttention, Oldest: s.Oldest, Waiting: map[WaitReason]int64{}}
		for reason, n := range map[WaitReason]int64{WaitOutcome: s.WaitingOutcome, WaitSignal: s.WaitingSignal,
			WaitTimer: s.WaitingTimer, WaitApproval: s.WaitingApproval} {
			if n > 0 {
				out[i].Waiting[reason] = n
			}
		}
	}
	return out, nil
}

// observed calls an Observer's function, containing its panic: an observer's
// bug is logged, never a run's failure or the process's end.
func (r *run) observed(ctx context.Context, what string, call func()) {
	defer func() {
		if v := recover(); v != nil {
			r.logger().ErrorContext(ctx, "observer panicked; ignored", slog.String("call", what), slog.Any("panic", v))
		}
	}()
	call()
}

// observedCtx is observed for a call that returns the context to go on with:
// ctx itself when it panicked.
func (r *run) observedCtx(ctx context.Context, what string, call func() context.Context) (out context.Context) {
	out = ctx
	r.observed(ctx, what, func() {
		if c := call(); c != nil {
			out = c
		}
	})
	return out
}
