package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/store"
)

// Reasons a run ends without finishing its operation (Observer.RunEnded hears
// them as a RunEnd). None of them is a failure of the operation: another run
// carries it on, or an operator does.
var (
	// errKeyTaken ends a first attempt whose reservation found the key
	// already taken (Start returns that operation).
	errKeyTaken = errors.New("idempotency key already taken")
	// errHandedOff ends a run that scheduled a River job to carry the
	// operation on after a backoff.
	errHandedOff = errors.New("handed off to a river job")
	// errRetryNow: the run waited out a short backoff itself; the step runs again.
	errRetryNow = errors.New("retry the step now")
	// errLost: another run recorded the work first; this run's lease had expired.
	errLost = errors.New("lease lost to another run")
	// errLeaseExpiring: the run could not renew its lease and stopped before it
	// ran out, so that no other run takes the operation over while it works.
	errLeaseExpiring = errors.New("lease could not be renewed; stopped before it ran out")
	// errKeyRowLocked: a first attempt's reservation waited out lock_timeout on
	// a reservation of its key that another transaction had not committed (or
	// on a row that could then not be read). Nothing was reserved; a retry is
	// answered once that transaction ends.
	errKeyRowLocked = errors.New("the reservation waited out lock_timeout, and no committed operation holds the key")
	// errParked ends a run that parked the operation for an operator.
	errParked = errors.New("parked for an operator")
	// errWaiting ends a run that handed the operation back because this
	// process's definition lacks a step the operation needs, for a process
	// that has it.
	errWaiting = errors.New("waiting for a process that can run it")
)

// run is one attempt at an operation by one process: the first attempt, or a
// resume by a River worker. It holds the operation through the row's lease
// (locked_by and locked_until).
type run struct {
	e     *Engine
	def   *opDef
	id    uuid.UUID
	runID uuid.UUID
	scope string
	key   string
	// secret is the operation's secret for its derived keys (nil: scheme 1).
	secret []byte
	// fp is the start's fingerprint, for a first attempt whose key is taken.
	fp *Fingerprint
	// steps are the steps to run, in the order the operation was started with. A
	// nil entry is a step this process's definition lacks (it had succeeded).
	steps []*stepDef
	// startedSteps are the names of the steps the operation was started with.
	startedSteps []string
	in           any
	// state is the operation's *S; stateRaw is its encoding after the last step
	// that succeeded, from which state is restored when an attempt fails.
	state    any
	stateRaw []byte
	status   map[string]store.StepState
	// tries counts the recorded attempts of each step; compensations those of
	// each step's compensation.
	tries         map[string]int
	compensations map[string]int
	// rowed marks the steps that have a row of their own (a failed attempt
	// recorded one), which their checkpoint then updates.
	rowed map[string]bool
	// waits holds what is known of the steps that wait for their outcome, and
	// of the last request of external steps that failed an attempt.
	waits map[string]*stepWait
	// failingSince is when each step's first recorded failure began (its
	// row's start), or this run's first failure of it.
	failingSince map[string]time.Time
	// failure is the permanent error of a failed step, once there is one;
	// failureStored is true once the operation's row holds it.
	failure       *PermanentError
	failureStored bool
	// notMade, when not nil, is a decision that an external step's call was
	// not made, which the transaction that records the failure checks.
	notMade *notMade
	// undecodable is why the input or state did not decode, for a cancel that
	// goes on without them.
	undecodable error
	resumed     bool
	// leftUntil is when the operation that Cancel claimed was left alone
	// until, to give it back so; heldUntil is the same when a run held it
	// (and may have been calling out until then), else zero.
	leftUntil time.Time
	heldUntil time.Time
	// runs counts the runs of the operation, this one included.
	runs int

	// insert, while not nil, is the reservation still to commit, which the first
	// transaction of a first attempt carries.
	insert *store.OperationInsertParams
	// pending are checkpoints of external steps that the next transaction commits.
	pending []store.StepCheckpointParams

	local *localRun
	// room is the run's place in the process's bounds, given back in end; nil
	// for a run that holds none (an operator's cancel or resolve).
	room *room
	// mu guards reserved, which the lease timer reads, reservedAt, when this
	// process saw the reservation commit, and local's quiet and speaker.
	mu         sync.Mutex
	reserved   bool
	reservedAt time.Time
	cancelRun  context.CancelCauseFunc
	// leaseFrom is when the run's claim (or reservation) was sent: the lease it
	// holds runs out a Lease after it at the latest. mu guards it: a first
	// attempt moves it to when its reservation was sent, once it commits.
	leaseFrom time.Time
}

// execute runs the first attempt of a new operation.
func (r *run) execute(ctx context.Context) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.cancelRun = cancel
	stopLease := r.keepLease(ctx)
	defer stopLease()

	ctx = r.startRun(ctx)
	info, err := r.safeRunSteps(ctx)
	r.end(ctx, info, err)
}

// safeRunSteps is runSteps, with a panic of the engine's own (user code is
// protected where it is called) turned into the run's error: the process lives,
// and the operation resumes once its lease expires.
func (r *run) safeRunSteps(ctx context.Context) (info *Info, err error) {
	defer func() {
		if v := recover(); v != nil {
			info, err = nil, fmt.Errorf("engine: run panicked: %v", v)
		}
	}()
	return r.runSteps(ctx)
}

// end reports how the run ended to the starter and to the waiters.
func (r *run) end(ctx context.Context, info *Info, err error) {
	// The reservation waited out lock_timeout on the key's row: nothing was
	// reserved, and the starter is answered from the row (see existing).
	keyLocked := r.insert != nil && lockNotAvailable(err)
	switch {
	case err == nil:
		// A logger with the run's attributes costs a few microseconds to make:
		// not on every operation for a line that is usually off.
		if r.e.logger.Enabled(ctx, slog.LevelDebug) {
			r.logger().DebugContext(ctx, "operation finished", slog.String("status", string(info.Status)), slog.Int("runs", info.Runs))
		}
	case errors.Is(err, errKeyTaken), errors.Is(err, errHandedOff), errors.Is(err, errParked), errors.Is(err, errWaiting),
		errors.Is(err, errCannotCancel): // handed back as it was
	case keyLocked: // logged below, when no committed operation answers
	case errors.Is(err, errLost):
		r.logger().WarnContext(ctx, "run stopped: another run took the operation over")
	case errors.Is(err, context.Canceled) && r.isReserved():
		// The engine is stopping: hand the operation back at once, so that the next
		// sweep, here after a restart or in another process, resumes it without
		// waiting for the lease to expire.
		releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, _, rerr := r.e.store.OperationRelease(releaseCtx, r.e.control, r.id, r.runID, 0, 0, true); rerr != nil {
			if errors.Is(context.Cause(ctx), errLeaseExpiring) {
				// The database did not answer in time: the operation resumes
				// as soon as it does.
				r.e.strand(r, true)
				r.logger().WarnContext(ctx, "run stopped: the database did not answer; the operation resumes as soon as it does", slog.Any("error", rerr))
				break
			}
			r.logger().WarnContext(ctx, "could not release the operation; it resumes once its lease expires", slog.Any("error", rerr))
		} else {
			r.logger().InfoContext(ctx, "run stopped with the engine; the operation resumes at the next sweep")
		}
	case !r.isReserved():
		// No operation to name: the key's reservation was not confirmed (the
		// database did not answer), and its caller is told so. Should it have
		// committed after all, a sweep resumes it once its lease expires.
		r.e.logger.WarnContext(ctx, "the key's reservation was not confirmed; the start is refused",
			slog.String("operation", r.def.name), slog.String("key", r.key), slog.Any("error", err))
	case IsUnavailable(err):
		r.e.strand(r, true)
		r.logger().WarnContext(ctx, "run stopped: the database did not answer; the operation resumes as soon as it does", slog.Any("error", err))
	default:
		r.logger().ErrorContext(ctx, "run stopped; the operation resumes once its lease expires", slog.Any("error", err))
	}
	if info != nil {
		// Before the starter hears of it: an answer it gives is counted already.
		r.observeFinished(ctx, info.Status)
	}
	var told *reservation // what a starter whose reservation did not commit hears
	if r.local != nil {
		r.mu.Lock()
		if r.local.speaker != nil {
			// done tells a quiet starter now. A speaker that fired already
			// may still send the reservation, into a buffer nobody needs.
			r.local.speaker.Stop()
		}
		r.mu.Unlock()
		if !r.isReserved() {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
				// Why the run stopped (errLeaseExpiring: the database did not
				// answer in time) says more than what it was doing then.
				err = fmt.Errorf("%w: %w", cause, err)
			}
			res := reservation{err: err}
			switch {
			case errors.Is(err, errKeyTaken):
				res = r.existing(ctx, nil)
			case keyLocked:
				res = r.existing(ctx, err)
				// What the observer's RunEnded is told: a key taken, when a
				// committed operation holds it, as the starter is told; else
				// why nobody could tell.
				if errors.Is(res.err, errKeyRowLocked) {
					err = res.err
					r.logger().InfoContext(ctx, "the reservation waited out lock_timeout on its key, which no committed operation holds; the start is to be retried",
						slog.Any("error", err))
				} else {
					err = fmt.Errorf("%w: %w", errKeyTaken, err)
				}
			case IsUnavailable(err) && r.reservedAfterAll(ctx):
				// Its answer was lost, not the reservation: the starter is told
				// it started, never that the database was unavailable while
				// its key is taken. When it committed is not known: when
				// this process found it had stands for it.
				r.mu.Lock()
				r.reservedAt = time.Now()
				r.mu.Unlock()
				res = reservation{created: true}
			}
			told = &res
		}
	}
	// The reads above ran within the run's place; it is given back before the
	// starter and the waiters hear.
	r.room.giveBack()
	if r.local != nil {
		if told != nil {
			r.local.reserved <- *told
		}
		r.local.info = info
		close(r.local.done)
	}
	if info != nil {
		r.e.notifyFinished(info)
	}
	r.endRun(ctx, err)
}

func (r *run) isReserved() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reserved
}

func (r *run) logger() *slog.Logger {
	return r.e.logger.With(
		slog.String("operation_id", r.id.String()),
		slog.String("operation", r.def.name),
		slog.String("key", r.key),
	)
}

// runSteps runs every step that has not succeeded, then stores the result. It
// returns the finished operation, or why the run ended without finishing it.
func (r *run) runSteps(ctx context.Context) (*Info, error) {
	if r.failure != nil {
		return r.compensate(ctx)
	}
	for i, st := range r.steps {
		if st == nil || r.status[st.name] == store.StepSucceeded {
			continue
		}
		last := i == len(r.steps)-1
		var (
			info *Info
			err  error
		)
		for {
			switch st.kind {
			case StepKindTx:
				info, err = r.runTxStep(ctx, i, st, last)
			case StepKindWait:
				info, err = r.runWaitStep(ctx, i, st, last)
			default:
				info, err = r.runExternalStep(ctx, i, st, last)
			}
			if !errors.Is(err, errRetryNow) {
				break
			}
		}
		if err != nil || info != nil {
			return info, err
		}
	}
	// Every step had succeeded already: only the result is left to store.
	return r.storeResult(ctx)
}

// storeResult stores the result, with the pending checkpoints.
func (r *run) storeResult(ctx context.Context) (*Info, error) {
	tx := r.beginLast(ctx)
	defer tx.end(ctx)
	info, err := r.commitSuccess(ctx, tx)
	if re := (*resultError)(nil); errors.As(err, &re) {
		return r.resultFailed(ctx, re.err)
	}
	return info, err
}

// succeeded queues the checkpoint of a step whose effect has happened. The run
// goes on from the state as it decodes from the checkpoint, so that a first
// attempt sees what a resumed run would; a state that does not decode is an
// error. A copy of a state of values only is that already, unless
// encoding/json replaced invalid UTF-8 in one of its strings; a copy, so that
// the next step shares no pointer with the last, as after a decode.
func (r *run) succeeded(i int, st *stepDef, attempt int, started time.Time, resolvedBy ResolvedBy) error {
	raw, err := json.Marshal(r.state)
	if err != nil {
		return fmt.Errorf("encode state after step %s: %w", st.name, err)
	}
	if r.def.stateValueOnly && !replacedUTF8(raw) {
		r.state = r.def.copyState(r.state)
	} else {
		state, err := r.def.reloadState(raw)
		if err != nil {
			return fmt.Errorf("state after step %s: %w", st.name, err)
		}
		r.state = state
	}
	r.stateRaw = raw
	r.status[st.name] = store.StepSucceeded
	r.tries[st.name] = attempt
	r.pending = append(r.pending, store.StepCheckpointParams{
		Name:       st.name,
		Position:   i,
		Attempts:   attempt,
		Output:     raw,
		StartedAt:  started,
		ResolvedBy: string(resolvedBy),
		// An attempt before this one failed and was recorded in the step's row.
		Retried:   attempt > 1 || r.rowed[st.name],
		Reference: r.e.referenceOf(st, r.state),
	})
	return nil
}

// pastPivot reports whether a pivot (a step that calls out and cannot be undone)
// has succeeded: from then on the operation only goes forward. A succeeded step
// that this process's definition lacks counts as one, since nobody here can
// tell.
func (r *run) pastPivot() bool {
	for name, state := range r.status {
		if state == store.StepSucceeded && r.def.cannotUndo(name) {
			return true
		}
	}
	return false
}

// stepName is the name of the i-th step the operation was started with.
func (r *run) stepName(i int) string {
	if r.steps[i] != nil {
		return r.steps[i].name
	}
	return r.startedSteps[i]
}

func (r *run) restoreState() error {
	s, err := r.def.decodeState(r.stateRaw)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	r.state = s
	return nil
}

// hook calls Config.Faults.Hook, whose error (a fault it injects) fails the attempt.
func (r *run) hook(ctx context.Context, st *stepDef, p faults.Point, attempt int) error {
	if r.e.cfg.Faults.Hook == nil {
		return nil
	}
	return r.e.cfg.Faults.Hook(ctx, faults.Event{
		Operation: r.def.name, OperationID: r.id, Step: st.name, Point: p, Attempt: attempt, Resumed: r.resumed,
	})
}
