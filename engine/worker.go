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
	return w.e.resume(ctx, job.Args.OperationID, job.Args.Operation, job.Args.Recovery)
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
	for _, op := range expired {
		tx, err := e.control.Begin(ctx)
		if err != nil {
			return fmt.Errorf("engine: sweep: %w", err)
		}
		ok, err := e.store.OperationExtendExpired(ctx, tx, op.ID, e.cfg.Lease, nil)
		if err == nil && ok {
			_, err = e.river.InsertTx(ctx, tx, resumeArgs{OperationID: op.ID, Operation: op.Name, Recovery: true}, &river.InsertOpts{Queue: e.cfg.Queue})
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
// recovery says that the run before it stopped renewing its lease.
func (e *Engine) resume(ctx context.Context, id uuid.UUID, name string, recovery bool) error {
	_, err := e.claimAndRun(ctx, id, name, nil, recovery)
	switch {
	case err == nil, errors.Is(err, ErrHandedOff), errors.Is(err, errLost), errors.Is(err, errNotClaimed),
		errors.Is(err, ErrParked), errors.Is(err, ErrWaiting), errors.Is(err, errVersionNotRun):
		// errVersionNotRun: the job ends; the operation's lease runs out, and
		// the sweeper of a process that runs its version takes it.
		return nil
	default:
		return err
	}
}

// errNotClaimed: the operation is finished, parked, or a live run holds it.
var errNotClaimed = errors.New("operation not claimed")

// errVersionNotRun: the operation's version is not registered in this process,
// which leaves it alone.
var errVersionNotRun = fmt.Errorf("%w: this process does not run the operation's version", ErrNotRegistered)

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

// errCannotCancel: Cancel would need the input or state of an operation whose
// input or state does not decode.
var errCannotCancel = errors.New("operation cannot be cancelled")

// claimAndRun claims an operation and runs what is left of it; with cancelReq, it
// ends the operation failed with that error instead, after compensating, unless
// it is past its point of no return (ErrPastPivot).
func (e *Engine) claimAndRun(ctx context.Context, id uuid.UUID, name string, cancelReq *cancelling, recovery bool) (*Info, error) {
	var cancelWith *PermanentError
	if cancelReq != nil {
		cancelWith = cancelReq.err
	}
	versions := e.versions[name]
	if len(versions) == 0 {
		// Another process may know the type; River retries the job.
		return nil, fmt.Errorf("engine: run %s: %w: %q", id, ErrNotRegistered, name)
	}
	if !e.addRun() {
		return nil, ErrStopped
	}
	defer e.runs.Done()
	runID := uuid.New()
	leaseFrom := time.Now()
	// Only an operation of a version this process runs is claimed: one of
	// another is left exactly as it is.
	rec, err := e.store.OperationClaim(ctx, e.pool, id, runID, e.cfg.Lease, cancelReq != nil, versions)
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
	r := &run{
		e:             e,
		def:           def,
		id:            id,
		runID:         runID,
		scope:         rec.Scope,
		key:           rec.Key,
		secret:        rec.KeySecret,
		fp:            decodeFingerprint(rec.Fingerprint),
		startedSteps:  rec.Steps,
		status:        make(map[string]store.StepState, len(rec.Steps)),
		tries:         make(map[string]int, len(rec.Steps)),
		compensations: make(map[string]int, len(rec.Steps)),
		rowed:         make(map[string]bool, len(rec.Steps)),
		waits:         make(map[string]*stepWait),
		// The first claim of an operation reserved in a caller's transaction
		// (StartTx) is its first attempt: no run before it can have called
		// out, so its steps call without asking their lookups first.
		resumed:   rec.Runs > 1,
		reserved:  true,
		runs:      rec.Runs,
		leaseFrom: leaseFrom,
	}
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
				r.end(ctx, nil, ErrHandedOff) // handed back, nothing to log
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
			r.end(ctx, nil, ErrHandedOff)
			return nil, fmt.Errorf("engine: cancel %s: %w: it is compensating, and its input or state does not decode: %w", id, errCannotCancel, r.undecodable)
		case cancelWith != nil && r.failure == nil:
			r.logger().InfoContext(ctx, "cancelling operation", slog.Int("run", rec.Runs))
			if err := r.mayCancel(ctx); err != nil {
				r.giveBack(ctx, rec)
				r.end(ctx, nil, ErrHandedOff) // handed back, nothing to log
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

// mayCancel returns ErrPastPivot when the operation may not be compensated: a
// pivot has succeeded, or the first unfinished step calls out and its call may
// have gone through (its checkpoint rides with the next transaction, so after a
// crash the rows say "not called"): its lookup, by derived key, is asked, and
// found means past the pivot, or, for a step with a compensation, one more step
// to compensate.
func (r *run) mayCancel(ctx context.Context) error {
	if r.pastPivot() {
		return fmt.Errorf("engine: cancel %s: %w: a step that cannot be undone has succeeded", r.id, ErrPastPivot)
	}
	if r.undecodable != nil {
		// Nothing that needs the input or the state may run: no lookup, no
		// compensation.
		for i, st := range r.steps {
			name := r.stepName(i)
			switch {
			case r.status[name] == store.StepSucceeded && st != nil && st.compensate != nil:
				return fmt.Errorf("engine: cancel %s: %w: step %s has a compensation to run, and the operation's input or state does not decode: %w", r.id, errCannotCancel, name, r.undecodable)
			case r.status[name] != store.StepSucceeded && st != nil && st.kind == StepKindExternal && r.status[name] != store.StepFailed:
				return fmt.Errorf("engine: cancel %s: %w: step %s may have called out, and its lookup needs the operation's input, which does not decode: %w", r.id, errCannotCancel, name, r.undecodable)
			}
			if r.status[name] != store.StepSucceeded {
				break
			}
		}
		return nil
	}
	for i, st := range r.steps {
		name := r.stepName(i)
		if r.status[name] == store.StepSucceeded {
			continue
		}
		if st == nil || st.kind != StepKindExternal || r.status[name] == store.StepFailed {
			return nil // a transactional step, or an answer that said "not done"
		}
		w := r.waits[name]
		if r.status[name] == store.StepWaiting && w != nil && w.pending {
			return fmt.Errorf("engine: cancel %s: %w", r.id, &OutcomeUnknownError{Step: name, Pending: true,
				Reason: "the outside service accepted the call and has not settled it"})
		}
		if st.lookup == nil {
			// Whether its call went through is unknown, and undoing the steps
			// before it would be a guess (a compensation of its own would not
			// run: nothing says it succeeded).
			return fmt.Errorf("engine: cancel %s: %w: step %s may have called out, and has no lookup to tell", r.id, ErrPastPivot, name)
		}
		attempt := r.tries[name] + 1
		found, err := r.lookup(ctx, st, r.attempt(st, attempt))
		switch answer, _, _ := readLookup(found, err); answer {
		case answerPending:
			return fmt.Errorf("engine: cancel %s: %w", r.id, &OutcomeUnknownError{Step: name, Pending: true,
				Reason: "the outside service is still processing the call"})
		case answerFailed:
			return nil // the call ended without effect
		case answerHalted, answerNone:
			return fmt.Errorf("engine: cancel %s: %w", r.id, &OutcomeUnknownError{Step: name,
				Reason: "its lookup cannot answer: " + err.Error()})
		case answerNothing:
			if end := r.settleEnd(st); time.Now().Before(end) {
				return fmt.Errorf("engine: cancel %s: %w", r.id, &OutcomeUnknownError{Step: name, KnownAt: end,
					Reason: "its last request may still land at the outside service"})
			}
			return nil
		}
		if st.pivot() {
			return fmt.Errorf("engine: cancel %s: %w: step %s went through (found by its derived key)", r.id, ErrPastPivot, name)
		}
		// The call went through: it is compensated with the others.
		return r.succeeded(i, st, attempt, time.Now(), "lookup")
	}
	return nil
}

// cancelling is what Cancel asks of claimAndRun: to end the operation with
// err, and, if it may not, to leave it alone again until leftUntil, its lease
// as Cancel read it before claiming.
type cancelling struct {
	// err is the cancel's error; resolve, instead, an operator's resolution
	// (Resolve).
	err       *PermanentError
	resolve   *Resolution
	leftUntil time.Time
	// heldUntil is leftUntil when a run held the operation, else zero: a run
	// may have been calling out until its lease ran out.
	heldUntil time.Time
}

// operatorClaim is the start of what Cancel or Resolve asks of claimAndRun
// for rec as they read it: when it was left alone until, and, when a run held
// it or may have been calling out (calls_until), until when a request of its
// may have been sent.
func operatorClaim(rec *store.Operation) *cancelling {
	req := &cancelling{leftUntil: rec.LockedUntil}
	if rec.LockedBy != nil {
		req.heldUntil = rec.LockedUntil
	}
	if rec.CallsUntil != nil && rec.CallsUntil.After(req.heldUntil) {
		req.heldUntil = *rec.CallsUntil
	}
	return req
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
			w := &stepWait{pending: s.Pending, cause: s.LastCause}
			if s.SentAt != nil {
				w.sentAt = *s.SentAt
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
			r.failure = fault("step_failed", s.Name, s.LastCause)
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
		verr := &VersionError{Operation: r.def.name, Started: rec.Steps, Registered: r.def.names, Missing: missing}
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
	verr := &VersionError{Operation: r.def.name, Started: rec.Steps, Registered: r.def.names, Missing: missing}
	if _, logged := r.e.waitLogged.LoadOrStore(r.id, true); !logged {
		r.logger().ErrorContext(ctx, "cannot run operation here; leaving it for a process that can", slog.Any("error", verr))
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	ok, err := r.e.store.OperationSetAttention(ctx, tx, r.id, r.runID, CodeDefinitionChanged, verr.Error())
	if err != nil {
		return runError(err)
	}
	if !ok {
		return errLost
	}
	if err := r.handOff(ctx, tx, max(r.e.cfg.Lease, time.Minute)); !errors.Is(err, ErrHandedOff) {
		return err
	}
	return ErrWaiting
}
