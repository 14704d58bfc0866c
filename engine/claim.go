package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

// newRun makes a run of operation id of def, whose steps, as it was started,
// are started: what a first attempt and a claim share.
func (e *Engine) newRun(def *opDef, id, runID uuid.UUID, scope, key string, secret []byte, fp *Fingerprint, started []string) *run {
	return &run{
		e:             e,
		def:           def,
		id:            id,
		runID:         runID,
		scope:         scope,
		key:           key,
		secret:        secret,
		fp:            fp,
		startedSteps:  started,
		status:        make(map[string]store.StepState, len(started)),
		tries:         make(map[string]int, len(started)),
		compensations: make(map[string]int, len(started)),
	}
}

// defKeys returns the registered definitions, in a fixed order.
func (e *Engine) defKeys() []defKey {
	keys := make([]defKey, 0, len(e.defs))
	for k := range e.defs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b defKey) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return a.version - b.version
	})
	return keys
}

// claimAndRun claims an operation and runs what is left of it; with cancelReq, it
// ends the operation failed with that error instead, after compensating, unless
// it is past its point of no return (ErrPastPivot).
func (e *Engine) claimAndRun(ctx context.Context, id uuid.UUID, name string, cancelReq *cancelling, recovery bool, place *room) (*Info, error) {
	var cancelWith *PermanentError
	if cancelReq != nil {
		cancelWith = cancelReq.err
	}
	versions := e.versions[name]
	if len(versions) == 0 {
		// Another process may know the type; River retries the job.
		return nil, fmt.Errorf("engine: run %s: %w: %q", id, errNotRegistered, name)
	}
	if !e.addRun() {
		return nil, ErrStopped
	}
	defer e.runs.Done()
	runID := e.newRunID()
	leaseFrom := time.Now()
	// Only an operation of a version this process runs is claimed: one of
	// another is left exactly as it is.
	rec, err := e.store.OperationClaim(ctx, e.pool, id, runID, e.cfg.Lease, cancelReq != nil, versions, e.settleWindows[name])
	if errors.Is(err, store.ErrNotFound) {
		if other, err := e.store.OperationGet(ctx, e.pool, id); err == nil && other.State == store.OperationInProgress &&
			!slices.Contains(versions, int32(other.Version)) {
			e.logWaiting(ctx, id, name, other.Version)
			return nil, fmt.Errorf("engine: run %s: %w: %q version %d (this process runs %v)", id, errVersionNotRun, name, other.Version, versions)
		}
		return nil, errNotClaimed
	}
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	def := e.def(name, rec.Version)
	r := e.newRun(def, id, runID, rec.Scope, rec.Key, rec.KeySecret, decodeFingerprint(rec.Fingerprint), rec.Steps)
	r.room = place
	r.rowed = make(map[string]bool, len(rec.Steps))
	r.waits = make(map[string]*stepWait)
	// The first claim of an operation reserved in a caller's transaction
	// (StartTx) is its first attempt: no run before it can have called out, so
	// its steps call without asking their lookups first.
	r.resumed = rec.Runs > 1
	r.reserved = true
	r.runs = rec.Runs
	r.leaseFrom = leaseFrom
	if cancelReq != nil {
		r.leftUntil, r.heldUntil = cancelReq.leftUntil, cancelReq.heldUntil
	}
	if recovery {
		r.observeRecovered(ctx)
	}
	if rec.Runs == 1 && cancelReq == nil {
		r.observeStarted(ctx)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.cancelRun = cancel
	stopLease := r.keepLease(ctx)
	defer stopLease()
	ctx = r.startRun(ctx)
	// Read under the lease's watch: a run whose read waits past its lease stops.
	recorded, err := e.store.StepListByOperation(ctx, e.pool, id)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		r.end(ctx, nil, err)
		return nil, fmt.Errorf("engine: %w", err)
	}

	info, err := r.load(ctx, rec, recorded, cancelReq != nil)
	if err == nil && info == nil {
		switch {
		case cancelReq != nil && cancelReq.resolve != nil:
			r.logger().InfoContext(ctx, "resolving operation", slog.Int("run", rec.Runs))
			failed, err := r.resolveStep(ctx, rec.Parked, cancelReq.resolve)
			if err != nil {
				r.giveBack(ctx, rec)
				r.end(ctx, nil, errHandedOff) // handed back, nothing to log
				return nil, err
			}
			// Decided: no longer parked nor needing attention, so that the
			// sweeper resumes it if this run dies on the way.
			if ok, err := e.store.OperationUnpark(ctx, e.pool, id, runID); err != nil || !ok {
				if err == nil {
					err = errLost
				}
				r.end(ctx, nil, err)
				return nil, err
			}
			if failed != nil {
				info, err = r.compensateWith(ctx, failed)
				r.end(ctx, info, err)
				return info, err
			}
		case cancelWith != nil && r.failure != nil && r.undecodable != nil:
			// Compensating already, and its compensations need the state.
			r.giveBack(ctx, rec)
			r.end(ctx, nil, errHandedOff)
			return nil, fmt.Errorf("engine: cancel %s: %w: it is compensating, and its input or state does not decode: %w", id, errCannotCancel, r.undecodable)
		case cancelWith != nil && r.failure == nil:
			r.logger().InfoContext(ctx, "cancelling operation", slog.Int("run", rec.Runs))
			if err := r.mayCancel(ctx); err != nil {
				r.giveBack(ctx, rec)
				r.end(ctx, nil, errHandedOff) // handed back, nothing to log
				return nil, err
			}
			r.failure = cancelWith
		default:
			r.logger().InfoContext(ctx, "resuming operation", slog.Int("run", rec.Runs))
		}
		info, err = r.safeRunSteps(ctx)
	}
	r.end(ctx, info, err)
	return info, err
}

// giveBack hands an operation that Cancel claimed but may not cancel back as
// it was: parked again, or released for the sweeper at the time it was left
// alone until.
func (r *run) giveBack(ctx context.Context, rec *store.Operation) {
	ctx = context.WithoutCancel(ctx)
	var err error
	if rec.Parked {
		_, err = r.e.store.OperationPark(ctx, r.e.pool, r.id, r.runID, rec.AttentionCode, rec.Attention)
	} else {
		// Left alone until it was before: an operation waiting out a backoff
		// for its River job is not swept up early.
		_, err = r.e.store.OperationGiveBack(ctx, r.e.pool, r.id, r.runID, r.leftUntil)
	}
	if err != nil {
		r.logger().WarnContext(ctx, "could not hand the operation back; it resumes once its lease expires", slog.Any("error", err))
	}
}

// load restores a run from the operation's records. An input or a state that
// does not decode parks the operation at once (a retry would not decode it
// either); a definition that lacks a step the operation still needs leaves it,
// needing attention, for a process that has the step.
func (r *run) load(ctx context.Context, rec *store.Operation, recorded []store.Step, cancelling bool) (*Info, error) {
	lastPos := -1
	for _, s := range recorded {
		r.status[s.Name] = s.State
		r.tries[s.Name] = s.Attempts
		r.compensations[s.Name] = s.Compensations
		if s.State == store.StepRetrying || s.State == store.StepWaiting {
			r.rowed[s.Name] = true
			if r.failingSince == nil {
				r.failingSince = make(map[string]time.Time)
			}
			r.failingSince[s.Name] = s.StartedAt
		}
		if s.SentAt != nil || s.State == store.StepWaiting {
			w := &stepWait{pending: s.Pending, cause: s.LastCause, reference: s.Reference}
			if s.SentAt != nil {
				w.sentAt = *s.SentAt
			}
			if s.SettleBy != nil {
				w.settleBy = *s.SettleBy
			}
			if s.WaitingSince != nil {
				w.since = *s.WaitingSince
			}
			r.waits[s.Name] = w
		}
		if (s.State == store.StepSucceeded || s.State == store.StepCompensated) && s.Position > lastPos {
			lastPos = s.Position
			r.stateRaw = s.Output
		}
		if s.State == store.StepFailed {
			r.failure = fault(codeStepFailed, s.Name, s.LastCause)
		}
	}
	if len(rec.Error) > 0 {
		pe := &PermanentError{}
		if json.Unmarshal(rec.Error, pe) == nil {
			r.failure = pe
		}
		r.failureStored = true
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
	if len(missing) > 0 && cancelling {
		r.giveBack(ctx, rec)
		verr := &versionError{Operation: r.def.name, Started: rec.Steps, Registered: r.def.names, Missing: missing}
		return nil, fmt.Errorf("engine: cancel %s: %w: %w", r.id, errCannotCancel, verr)
	}
	if len(missing) > 0 {
		return nil, r.waitForDefinition(ctx, rec, missing)
	}

	in, err := r.def.decodeInput(rec.Input)
	if err == nil {
		r.in = in
		err = r.restoreState()
	}
	if err != nil && cancelling {
		// A cancel may end it without decoding, when nothing needs to run.
		r.undecodable = err
		return nil, nil
	}
	if err != nil {
		r.logger().ErrorContext(ctx, "the operation's stored input or state does not decode; parking it", slog.Any("error", err))
		return r.park(ctx, nil, CodeUndecodableState, err.Error())
	}
	return nil, nil
}

// waitForDefinition hands back an operation that this process cannot run, as
// needing attention, to be tried again a while later (by this process or one
// that has the steps). It never fails or compensates it.
func (r *run) waitForDefinition(ctx context.Context, rec *store.Operation, missing []string) error {
	verr := &versionError{Operation: r.def.name, Started: rec.Steps, Registered: r.def.names, Missing: missing}
	if _, logged := r.e.waitLogged.LoadOrStore(r.id, true); !logged {
		r.logger().ErrorContext(ctx, "cannot run operation here; leaving it for a process that can", slog.Any("error", verr))
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	ok, err := r.e.store.OperationSetAttention(ctx, tx, r.id, r.runID, string(CodeDefinitionChanged), verr.Error())
	if err != nil {
		return runError(err)
	}
	if !ok {
		return errLost
	}
	if err := r.handOff(ctx, tx, max(r.e.cfg.Lease, time.Minute)); !errors.Is(err, errHandedOff) {
		return err
	}
	return errWaiting
}

// errNotClaimed: the operation is finished, parked, or a live run holds it.
var errNotClaimed = errors.New("operation not claimed")

// errVersionNotRun: the operation's version is not registered in this process,
// which leaves it alone.
var errVersionNotRun = fmt.Errorf("%w: this process does not run the operation's version", errNotRegistered)
