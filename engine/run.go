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
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// Reasons a run ends without finishing its operation. None of them is a failure of
// the operation: another run carries it on, or an operator does.
var (
	// errKeyTaken: the reservation found the key already taken.
	errKeyTaken = errors.New("idempotency key already taken")
	// errHandedOff: the run scheduled a River job to carry on after a backoff.
	errHandedOff = errors.New("handed off to a river job")
	// errRetryNow: the run waited out a short backoff itself; the step runs again.
	errRetryNow = errors.New("retry the step now")
	// errLost: another run recorded the work first; this run's lease had expired.
	errLost = errors.New("lease lost to another run")
	// errLeaseExpiring: the run could not renew its lease and stopped before it
	// ran out, so that no other run takes the operation over while it works.
	errLeaseExpiring = errors.New("lease could not be renewed; stopped before it ran out")
	// errParked: the run parked the operation for an operator.
	errParked = errors.New("parked for an operator")
	// errWaiting: this process cannot run the operation (its definition lacks a
	// step the operation needs); the run handed it back for another process.
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
	// failure is the permanent error of a failed step, once there is one;
	// failureStored is true once the operation's row holds it.
	failure       *PermanentError
	failureStored bool
	// undecodable is why the input or state did not decode, for a cancel that
	// goes on without them.
	undecodable error
	resumed     bool
	// runs counts the runs of the operation, this one included.
	runs int

	// insert, while not nil, is the reservation still to commit, which the first
	// transaction of a first attempt carries.
	insert *store.OperationInsertParams
	// pending are checkpoints of external steps that the next transaction commits.
	pending []store.StepCheckpointParams

	local *localRun
	// mu guards reserved, which the lease timer reads.
	mu        sync.Mutex
	reserved  bool
	cancelRun context.CancelCauseFunc
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

	info, err := r.safeRunSteps(context.WithValue(ctx, operationIDKey{}, r.id))
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
	switch {
	case err == nil:
		// A logger with the run's attributes costs a few microseconds to make:
		// not on every operation for a line that is usually off.
		if r.e.logger.Enabled(ctx, slog.LevelDebug) {
			r.logger().DebugContext(ctx, "operation finished", slog.String("status", string(info.Status)), slog.Int("runs", info.Runs))
		}
	case errors.Is(err, errKeyTaken), errors.Is(err, errHandedOff), errors.Is(err, errParked), errors.Is(err, errWaiting),
		errors.Is(err, errCannotCancel): // handed back as it was
	case errors.Is(err, errLost):
		r.logger().WarnContext(ctx, "run stopped: another run took the operation over")
	case errors.Is(err, context.Canceled) && r.isReserved():
		// The engine is stopping: hand the operation back at once, so that the next
		// sweep, here after a restart or in another process, resumes it without
		// waiting for the lease to expire.
		releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, _, rerr := r.e.store.OperationRelease(releaseCtx, r.e.control, r.id, r.runID, 0, 0); rerr != nil {
			r.logger().WarnContext(ctx, "could not release the operation; it resumes once its lease expires", slog.Any("error", rerr))
		} else {
			r.logger().InfoContext(ctx, "run stopped with the engine; the operation resumes at the next sweep")
		}
	default:
		r.logger().ErrorContext(ctx, "run stopped; the operation resumes once its lease expires", slog.Any("error", err))
	}
	if r.local != nil {
		if !r.isReserved() {
			if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
				// Why the run stopped (errLeaseExpiring: the database did not
				// answer in time) says more than what it was doing then.
				err = fmt.Errorf("%w: %w", cause, err)
			}
			res := reservation{err: err}
			if errors.Is(err, errKeyTaken) {
				res = r.existing(ctx)
			}
			r.local.reserved <- res
		}
		r.local.info = info
		close(r.local.done)
	}
	if info != nil {
		r.e.notifyFinished(info)
	}
}

func (r *run) isReserved() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reserved
}

// existing reads the operation that holds the key a first attempt could not
// reserve, and refuses it when its input differs from this start's.
func (r *run) existing(ctx context.Context) reservation {
	rec, err := r.e.store.OperationGetByKey(ctx, r.e.pool, r.scope, r.key)
	if err != nil {
		return reservation{err: fmt.Errorf("engine: read existing operation: %w", err)}
	}
	if err := r.e.sameStart(rec, r.def, r.fp, r.insert.Input); err != nil {
		return reservation{err: err}
	}
	return reservation{existing: infoFromRecord(rec)}
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
			if st.kind == KindTx {
				info, err = r.runTxStep(ctx, i, st, last)
			} else {
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

func (r *run) runTxStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	attempt := r.tries[st.name] + 1
	started := time.Now()
	var tx *txn
	if last {
		tx = r.beginLast(ctx)
	} else {
		tx = r.beginStep(ctx)
	}
	defer tx.end(ctx)
	err := protect(func() error {
		if err := r.hook(ctx, st, PointBefore, attempt); err != nil {
			return err
		}
		return st.tx(ctx, tx, r.in, r.state)
	})
	if tx.failed != nil {
		// The engine's own statements sent with the step's failed: the step's
		// error says nothing about the step.
		return nil, runError(tx.failed)
	}
	if err == nil {
		err = protect(func() error { return r.hook(ctx, st, PointAfterEffect, attempt) })
	}
	if err != nil {
		tx.end(ctx)
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	prevState, prevRaw, prevStatus := r.state, r.stateRaw, r.status[st.name]
	// undo takes back what succeeded queued, for a transaction that committed
	// nothing after all.
	undo := func() {
		r.pending = r.pending[:len(r.pending)-1]
		r.state, r.stateRaw, r.status[st.name] = prevState, prevRaw, prevStatus
	}
	if err := r.succeeded(i, st, attempt, started, ""); err != nil {
		// Its writes roll back with the transaction: nothing happened.
		tx.end(ctx)
		return r.parkUndecodable(ctx, err)
	}
	var info *Info
	if last {
		info, err = r.commitSuccess(ctx, tx)
	} else {
		err = r.commit(ctx, tx)
	}
	var se *stepError
	var re *resultError
	switch {
	case errors.As(err, &se):
		// A statement the step queued with AtCommit failed: the step did not
		// succeed after all, and nothing of its transaction committed.
		undo()
		return r.stepFailed(ctx, i, st, attempt, started, se.err)
	case errors.As(err, &re):
		// The result function failed, and the step's transaction rolled back
		// with the result: the step's writes never happened, so there is
		// nothing of its own to compensate.
		undo()
		return r.resultFailed(ctx, re.err)
	}
	return info, err
}

// call describes an attempt of the external step st.
func (r *run) call(st *stepDef, attempt int) Call {
	return Call{
		Key:          derivedKey(r.id, r.secret, r.def.name, r.scope, r.key, st.name),
		OperationID:  r.id,
		Attempt:      attempt,
		Operation:    r.def.name,
		Step:         st.name,
		Scope:        r.scope,
		OperationKey: r.key,
	}
}

// lookup asks st's lookup whether a call made under its derived key went
// through, filling the state when it did. A panic in it is its error.
func (r *run) lookup(ctx context.Context, st *stepDef, call Call) (bool, error) {
	found := false
	err := protect(func() error {
		var err error
		found, err = st.lookup(ctx, call, r.in, r.state)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("lookup: %w", err)
	}
	if found {
		r.logger().InfoContext(ctx, "lookup found the earlier attempt; not calling again",
			slog.String("step", st.name), slog.Int("attempt", call.Attempt))
	}
	return found, nil
}

func (r *run) runExternalStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	// The reservation commits before anything leaves the process.
	if r.insert != nil {
		if err := r.commit(ctx, r.begin(ctx)); err != nil {
			return nil, err
		}
	}
	attempt := r.tries[st.name] + 1
	started := time.Now()
	call := r.call(st, attempt)
	resolvedBy := "call"
	err := protect(func() error {
		if err := r.hook(ctx, st, PointBefore, attempt); err != nil {
			return err
		}
		// A resumed run cannot know whether the run before it called out: ask first.
		if st.lookup != nil && (r.resumed || attempt > 1) {
			found, err := r.lookup(ctx, st, call)
			if err != nil {
				return err
			}
			if found {
				resolvedBy = "lookup"
				return nil
			}
		}
		return st.external(ctx, call, r.in, r.state)
	})
	if err == nil {
		err = protect(func() error { return r.hook(ctx, st, PointAfterEffect, attempt) })
	}
	if err != nil {
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	return r.externalSucceeded(ctx, i, st, attempt, started, resolvedBy, last)
}

// externalSucceeded queues the checkpoint of an external step whose call went
// through, and stores the result when it was the last step.
func (r *run) externalSucceeded(ctx context.Context, i int, st *stepDef, attempt int, started time.Time, resolvedBy string, last bool) (*Info, error) {
	if err := r.succeeded(i, st, attempt, started, resolvedBy); err != nil {
		return r.parkUndecodable(ctx, err)
	}
	if !last {
		// Checkpointed with the next transaction, so that a first attempt commits
		// once before its call and once after.
		return nil, nil
	}
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
// error.
func (r *run) succeeded(i int, st *stepDef, attempt int, started time.Time, resolvedBy string) error {
	raw, err := json.Marshal(r.state)
	if err != nil {
		return fmt.Errorf("encode state after step %s: %w", st.name, err)
	}
	state, err := r.def.reloadState(raw)
	if err != nil {
		return fmt.Errorf("state after step %s: %w", st.name, err)
	}
	r.state, r.stateRaw = state, raw
	r.status[st.name] = store.StepSucceeded
	r.tries[st.name] = attempt
	r.pending = append(r.pending, store.StepCheckpointParams{
		Name:       st.name,
		Position:   i,
		Attempts:   attempt,
		Output:     raw,
		StartedAt:  started,
		ResolvedBy: resolvedBy,
		// Every attempt before this one failed and was recorded in the step's row.
		Retried: attempt > 1,
	})
	return nil
}

// pastPivot reports whether a pivot (a step that calls out and cannot be undone)
// has succeeded: from then on the operation only goes forward. A succeeded step
// that this process's definition lacks counts as one, since nobody here can
// tell.
func (r *run) pastPivot() bool {
	for i, st := range r.steps {
		if (st == nil || st.pivot()) && r.status[r.stepName(i)] == store.StepSucceeded {
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

// stepFailed handles a failed attempt: a retry later, a halt, or the end of the
// operation. Before the operation's point of no return a permanent failure
// compensates what succeeded; after it the operation only goes forward.
func (r *run) stepFailed(ctx context.Context, i int, st *stepDef, attempt int, started time.Time, stepErr error) (*Info, error) {
	if cause := context.Cause(ctx); cause != nil {
		// The run was stopped (the engine stops, or the lease was lost): the error
		// says nothing about the step.
		return nil, cause
	}
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	stepErr = fromSQL(stepErr)
	log := r.logger().With(slog.String("step", st.name), slog.Int("attempt", attempt))
	failure := &store.StepRecordFailureParams{
		OperationID: r.id, Name: st.name, Position: i, State: store.StepRetrying,
		Attempts: attempt, LastError: publicText(st.name, stepErr), LastCause: stepErr.Error(), StartedAt: started,
	}
	if pan := (*panicError)(nil); errors.As(stepErr, &pan) {
		log.ErrorContext(ctx, "step panicked", slog.Any("panic", pan.value), slog.String("stack", pan.stack))
	}

	var halt *HaltError
	if errors.As(stepErr, &halt) {
		log.WarnContext(ctx, "step halted the operation; it needs an operator", slog.String("code", halt.Code), slog.String("reason", halt.Message))
		return r.park(ctx, failure, halt.Code, fmt.Sprintf("step %s: %s", st.name, halt.Message))
	}
	var pe *PermanentError
	permanent := errors.As(stepErr, &pe)
	policy := st.retry
	if r.pastPivot() {
		if permanent {
			log.ErrorContext(ctx, "step failed for good after the point of no return; parking the operation", slog.String("error", stepErr.Error()))
			return r.park(ctx, failure, CodeFailedPastPivot,
				fmt.Sprintf("step %s failed for good after the point of no return: %s", st.name, pe.Error()))
		}
		if attempt < policy.MaxAttempts {
			log.InfoContext(ctx, "step failed; retrying later", slog.Any("error", stepErr))
			return r.retryLater(ctx, failure, policy.Backoff(attempt), nil)
		}
		log.WarnContext(ctx, "step keeps failing after the point of no return; retrying at the cap", slog.Any("error", stepErr))
		return r.retryLater(ctx, failure, policy.Cap, &attention{CodeRetryingPastPivot,
			fmt.Sprintf("step %s has failed %d times after the point of no return; retried every %s until it succeeds", st.name, attempt, policy.Cap)})
	}
	exhausted := !permanent && attempt >= policy.MaxAttempts
	if st.kind == KindExternal && (exhausted || permanent && pe.ServerFault()) {
		// Its call may have gone through: a business answer (Fail) says it did
		// not, a server fault or a run of failures does not. Only the lookup,
		// by the derived key, can tell before anything is undone.
		if st.lookup == nil {
			log.ErrorContext(ctx, "external step out of attempts, and no lookup can tell whether its call went through; parking the operation")
			return r.park(ctx, failure, CodeOutcomeUnknown,
				fmt.Sprintf("step %s failed %d times and has no lookup: whether its call went through is unknown", st.name, attempt))
		}
		found, err := r.lookup(ctx, st, r.call(st, attempt))
		if errors.As(err, &halt) {
			failure.LastError, failure.LastCause = publicText(st.name, err), err.Error()
			return r.park(ctx, failure, halt.Code, fmt.Sprintf("step %s: %s", st.name, halt.Message))
		}
		if err != nil {
			log.WarnContext(ctx, "external step out of attempts, and its lookup failed; retrying at the cap", slog.Any("error", err))
			failure.LastCause = stepErr.Error() + "; " + err.Error()
			return r.retryLater(ctx, failure, policy.Cap, &attention{CodeOutcomeUnknown,
				fmt.Sprintf("step %s failed %d times and its lookup fails: %s", st.name, attempt, err)})
		}
		if found {
			return r.externalSucceeded(ctx, i, st, attempt, started, "lookup", i == len(r.steps)-1)
		}
	}
	if exhausted {
		pe = fault(CodeAttemptsExhausted, st.name, fmt.Sprintf("step %s failed %d times; last error: %s", st.name, attempt, stepErr))
		permanent = true
	}
	if !permanent {
		log.InfoContext(ctx, "step failed; retrying later", slog.Any("error", stepErr), slog.Duration("backoff", policy.Backoff(attempt)))
		return r.retryLater(ctx, failure, policy.Backoff(attempt), nil)
	}
	pe = &PermanentError{Code: pe.Code, Message: pe.Message, Cause: pe.Cause, Details: pe.Details, Step: st.name, Fault: pe.ServerFault()}
	log.InfoContext(ctx, "step failed permanently", slog.String("code", pe.Code), slog.String("error", pe.Error()))
	r.failure = pe
	r.tries[st.name] = attempt
	r.status[st.name] = store.StepFailed
	failure.State = store.StepFailed
	failure.LastError, failure.LastCause = pe.Message, pe.Error()
	return r.compensateWith(ctx, failure)
}

// attention is why an operation needs an operator.
type attention struct {
	code, reason string
}

// retryLater records a failed attempt and tries the step again after delay:
// here, waiting out a short delay while holding the lease, or through a River
// job. With need, the operation is marked as needing attention meanwhile.
func (r *run) retryLater(ctx context.Context, failure *store.StepRecordFailureParams, delay time.Duration, need *attention) (*Info, error) {
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if err := r.e.store.StepRecordFailure(ctx, tx, *failure); err != nil {
		return nil, runError(err)
	}
	if need != nil {
		ok, err := r.e.store.OperationSetAttention(ctx, tx, r.id, r.runID, need.code, need.reason)
		if err != nil {
			return nil, runError(err)
		}
		if !ok {
			return nil, errLost
		}
	}
	r.tries[failure.Name] = failure.Attempts
	if delay > r.e.cfg.InlineRetryMax {
		return nil, r.handOff(ctx, tx, delay)
	}
	// A short backoff is waited out here, holding the lease: a River job would
	// wait for River's scheduler, which promotes scheduled jobs every few seconds.
	if err := r.commit(ctx, tx); err != nil {
		return nil, err
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil, errRetryNow
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// park records the failed attempt (failure, when not nil), parks the operation
// needing attention for code and reason, and commits with the pending
// checkpoints: nothing runs again until an operator retries or cancels it.
func (r *run) park(ctx context.Context, failure *store.StepRecordFailureParams, code, reason string) (*Info, error) {
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if failure != nil {
		if err := r.e.store.StepRecordFailure(ctx, tx, *failure); err != nil {
			return nil, runError(err)
		}
		r.tries[failure.Name] = failure.Attempts
	}
	ok, err := r.e.store.OperationPark(ctx, tx, r.id, r.runID, code, reason)
	if err != nil {
		return nil, runError(err)
	}
	if !ok {
		return nil, errLost
	}
	if err := r.commit(ctx, tx); err != nil {
		return nil, err
	}
	r.logger().WarnContext(ctx, "operation parked; it needs an operator (retry or cancel)", slog.String("code", code), slog.String("reason", reason))
	return nil, errParked
}

// parkUndecodable parks the operation because its state did not survive a
// round trip through its type.
func (r *run) parkUndecodable(ctx context.Context, err error) (*Info, error) {
	return r.park(ctx, nil, CodeUndecodableState, err.Error())
}

// handOff writes the pending checkpoints, gives the operation to a River job
// scheduled after delay (by the database's clock), and commits.
func (r *run) handOff(ctx context.Context, tx *txn, delay time.Duration) error {
	runAt, ok, err := r.e.store.OperationRelease(ctx, tx, r.id, r.runID, delay, r.e.cfg.Lease)
	if err != nil {
		return runError(err)
	}
	if !ok {
		return errLost
	}
	ptx, err := tx.pgx(ctx)
	if err != nil {
		return runError(err)
	}
	if _, err := r.e.river.InsertTx(ctx, ptx, resumeArgs{OperationID: r.id, Operation: r.def.name},
		&river.InsertOpts{Queue: r.e.cfg.Queue, ScheduledAt: runAt}); err != nil {
		return fmt.Errorf("engine: enqueue retry: %w", err)
	}
	if err := r.commit(ctx, tx); err != nil {
		return err
	}
	r.e.handedToRiver(ctx)
	return errHandedOff
}

// compensate undoes the succeeded steps after a permanent failure, last first,
// and ends the operation failed.
func (r *run) compensate(ctx context.Context) (*Info, error) {
	return r.compensateWith(ctx, nil)
}

// compensateWith is compensate with a failure record that the first of its
// transactions commits. Past the point of no return nothing is undone: the
// operation is parked for an operator instead.
func (r *run) compensateWith(ctx context.Context, failure *store.StepRecordFailureParams) (*Info, error) {
	if r.pastPivot() {
		r.logger().ErrorContext(ctx, "operation failed after the point of no return; parking it, nothing compensated",
			slog.String("error", r.failure.Error()))
		if failure != nil {
			failure.State = store.StepRetrying
		}
		return r.park(ctx, failure, CodeFailedPastPivot,
			"failed after the point of no return, so nothing was compensated: "+r.failure.Error())
	}
	var todo []*stepDef
	for i := len(r.steps) - 1; i >= 0; i-- {
		st := r.steps[i]
		if st != nil && st.compensate != nil && r.status[st.name] == store.StepSucceeded {
			todo = append(todo, st)
		}
	}
	if len(todo) > 0 && (len(r.pending) > 0 || !r.failureStored) {
		// A compensation marks its step's row, which a pending checkpoint (an
		// external step's, waiting for the next transaction) has not written
		// yet: commit them first, with the failure, which a resumed run then
		// carries on from.
		tx := r.begin(ctx)
		defer tx.end(ctx)
		if err := r.recordFailure(ctx, tx, failure); err != nil {
			return nil, err
		}
		if err := r.commit(ctx, tx); err != nil {
			return nil, err
		}
		failure = nil
	}
	for k, st := range todo {
		tx := r.beginStep(ctx)
		defer tx.end(ctx)
		if err := r.recordFailure(ctx, tx, failure); err != nil {
			return nil, err
		}
		if err := protect(func() error { return st.compensate(ctx, tx, r.in, r.state) }); err != nil {
			if tx.failed != nil {
				return nil, runError(tx.failed)
			}
			tx.end(ctx)
			return r.compensationFailed(ctx, st, failure, err)
		}
		ok, err := r.e.store.StepCompensated(ctx, tx, r.id, st.name)
		if err != nil {
			return nil, runError(err)
		}
		if !ok {
			return nil, errLost
		}
		var info *Info
		if k == len(todo)-1 {
			info, err = r.commitFailure(ctx, tx)
		} else {
			err = r.commit(ctx, tx)
		}
		if se := (*stepError)(nil); errors.As(err, &se) {
			return r.compensationFailed(ctx, st, failure, se.err)
		}
		if err != nil || info != nil {
			return info, err
		}
		failure = nil
		r.status[st.name] = store.StepCompensated
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if err := r.recordFailure(ctx, tx, failure); err != nil {
		return nil, err
	}
	return r.commitFailure(ctx, tx)
}

// recordFailure records a step's permanent failure (when failure is not nil),
// and the operation's error once, so that a resumed run finishes the operation
// with it.
func (r *run) recordFailure(ctx context.Context, tx *txn, failure *store.StepRecordFailureParams) error {
	if failure != nil {
		if err := r.e.store.StepRecordFailure(ctx, tx, *failure); err != nil {
			return runError(err)
		}
	}
	if r.failureStored {
		return nil
	}
	raw, err := json.Marshal(r.failure.stored())
	if err != nil {
		return fmt.Errorf("engine: encode error: %w", err)
	}
	ok, err := r.e.store.OperationSetError(ctx, tx, r.id, r.runID, raw)
	if err != nil {
		return runError(err)
	}
	if !ok {
		return errLost
	}
	r.failureStored = true
	return nil
}

// compensationFailed retries a compensation later, or, once the failed step's
// retry policy is spent, ends the operation failed with the compensation's error
// so that it is visible rather than retried forever.
func (r *run) compensationFailed(ctx context.Context, st *stepDef, failure *store.StepRecordFailureParams, compErr error) (*Info, error) {
	if cause := context.Cause(ctx); cause != nil {
		return nil, cause
	}
	compErr = fromSQL(compErr)
	// Counted in the step's row: each retry of a compensation is a run of its
	// own, and the step's own attempts do not count against it.
	n := r.compensations[st.name] + 1
	log := r.logger().With(slog.String("step", st.name), slog.Int("compensation_attempt", n))
	if pan := (*panicError)(nil); errors.As(compErr, &pan) {
		log.ErrorContext(ctx, "compensation panicked", slog.Any("panic", pan.value), slog.String("stack", pan.stack))
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	// This transaction commits the failure record whichever way it goes.
	stored := r.failureStored
	if err := r.recordFailure(ctx, tx, failure); err != nil {
		return nil, err
	}
	if err := r.e.store.StepCompensationFailed(ctx, tx, r.id, st.name, n,
		"compensation of step "+st.name+": "+publicText(st.name, compErr), compErr.Error()); err != nil {
		return nil, runError(err)
	}
	r.compensations[st.name] = n
	var pe *PermanentError
	if errors.As(compErr, &pe) || n >= st.retry.MaxAttempts {
		log.ErrorContext(ctx, "compensation failed for good", slog.Any("error", compErr))
		r.failure = fault(CodeCompensationFailed, r.failure.Step,
			fmt.Sprintf("compensation of step %s failed: %s (after: %s)", st.name, compErr, r.failure.Error()))
		return r.commitFailure(ctx, tx)
	}
	delay := st.retry.Backoff(n)
	log.WarnContext(ctx, "compensation failed; retrying later", slog.Any("error", compErr), slog.Duration("backoff", delay))
	if err := r.handOff(ctx, tx, delay); !errors.Is(err, errHandedOff) {
		r.failureStored = stored
		return nil, err
	}
	return nil, errHandedOff
}

// begin makes the run's next transaction, which sends nothing yet. It is
// fenced by the run, so that nothing it writes commits once another run holds
// the operation: on a first attempt whose reservation has not committed, the
// reservation goes first and is the fence; else OperationFence does, which
// also keeps another run's claim waiting until the transaction ends.
func (r *run) begin(ctx context.Context) *txn {
	tx := r.beginLast(ctx)
	if r.insert == nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationFence(ctx, tx.queue(), r.id, r.runID)
	}
	return tx
}

// beginStep is begin for the transaction of a step or a compensation, whose
// statements may wait on the application's locks: its fence goes with COMMIT,
// so that the row lock it takes does not keep the run's own lease renewals
// waiting meanwhile. It fences all the same: a claim by another run that
// committed first fails it, one that comes later waits for its commit.
func (r *run) beginStep(ctx context.Context) *txn {
	tx := r.beginLast(ctx)
	tx.fenceAtCommit = r.insert == nil
	return tx
}

// beginLast is begin for a transaction that ends the operation with its
// result: the statement that does (OperationFinish) is the fence.
func (r *run) beginLast(ctx context.Context) *txn {
	tx := newTxn(r.e.pool, r.e.cfg.AcquireTimeout)
	if r.insert != nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationReserve(ctx, tx.queue(), *r.insert)
	}
	return tx
}

// runError turns the errors that the engine's statements raise on purpose into
// the run's reasons to stop.
func runError(err error) error {
	switch {
	case errors.Is(err, store.ErrKeyTaken):
		return errKeyTaken
	case errors.Is(err, store.ErrFenced):
		return errLost
	}
	return err
}

// commit writes the pending checkpoints and commits.
func (r *run) commit(ctx context.Context, tx *txn) error {
	return r.commitEnd(ctx, tx, nil)
}

// commitEnd writes the pending checkpoints, ends the operation as end says (nil:
// it goes on), and commits, all in one round trip.
func (r *run) commitEnd(ctx context.Context, tx *txn, end *store.StepCheckpointManyParams) error {
	last := &pgx.Batch{}
	if tx.fenceAtCommit && end == nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationFence(ctx, store.Queue{Batch: last}, r.id, r.runID)
	}
	if end != nil || len(r.pending) > 0 {
		p := store.StepCheckpointManyParams{}
		if end != nil {
			p = *end
		}
		p.OperationID, p.Steps, p.Run = r.id, r.pending, r.runID
		// Only queued: it cannot fail here.
		_ = r.e.store.StepCheckpointMany(ctx, store.Queue{Batch: last}, p)
	}
	if err := tx.commit(ctx, last); err != nil {
		return runError(err)
	}
	r.pending = r.pending[:0]
	if r.insert != nil {
		r.insert = nil
		r.mu.Lock()
		r.reserved = true
		r.leaseFrom = tx.firstSent
		r.mu.Unlock()
		if r.local != nil {
			r.local.reserved <- reservation{created: true}
		}
	}
	return nil
}

// commitSuccess stores the result with the pending checkpoints and commits.
// When the result function fails it rolls back and returns a *resultError: the
// caller undoes what the transaction carried of its own, then calls
// resultFailed.
func (r *run) commitSuccess(ctx context.Context, tx *txn) (*Info, error) {
	var result []byte
	err := protect(func() error {
		var err error
		result, err = r.def.result(r.in, r.state)
		return err
	})
	if err != nil {
		tx.end(ctx)
		return nil, &resultError{err: err}
	}
	return r.finish(ctx, tx, store.OperationSucceeded, result, nil)
}

// resultError is the error of the operation's result function.
type resultError struct {
	err error
}

func (e *resultError) Error() string { return "result: " + e.err.Error() }
func (e *resultError) Unwrap() error { return e.err }

// resultFailed ends the operation failed with the result function's error,
// after the compensations of the steps that succeeded, or parks it when it is
// past its point of no return. The pending checkpoints stand: those steps did
// happen.
func (r *run) resultFailed(ctx context.Context, err error) (*Info, error) {
	if rerr := r.restoreState(); rerr != nil {
		return nil, rerr
	}
	last := r.stepName(len(r.steps) - 1)
	r.failure = fault(CodeResultFailed, last, err.Error())
	return r.compensate(ctx)
}

func (r *run) commitFailure(ctx context.Context, tx *txn) (*Info, error) {
	raw, err := json.Marshal(r.failure.stored())
	if err != nil {
		return nil, fmt.Errorf("engine: encode error: %w", err)
	}
	return r.finish(ctx, tx, store.OperationFailed, nil, raw)
}

func (r *run) finish(ctx context.Context, tx *txn, state store.OperationState, result, errRaw []byte) (*Info, error) {
	end := &store.StepCheckpointManyParams{Finish: true, State: state, Result: result, Error: errRaw}
	if err := r.commitEnd(ctx, tx, end); err != nil {
		return nil, err
	}
	now := time.Now()
	info := &Info{
		ID:         r.id,
		Name:       r.def.name,
		Scope:      r.scope,
		Key:        r.key,
		Status:     Status(state),
		Result:     result,
		Runs:       r.runs,
		FinishedAt: &now,
	}
	if state == store.OperationFailed {
		info.Error = r.failure
	}
	return info, nil
}

func (r *run) restoreState() error {
	s, err := r.def.decodeState(r.stateRaw)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	r.state = s
	return nil
}

// hook calls Config.Hook, whose error (a fault it injects) fails the attempt.
func (r *run) hook(ctx context.Context, st *stepDef, p Point, attempt int) error {
	if r.e.cfg.Hook == nil {
		return nil
	}
	return r.e.cfg.Hook(ctx, HookEvent{
		Operation: r.def.name, OperationID: r.id, Step: st.name, Point: p, Attempt: attempt, Resumed: r.resumed,
	})
}

// keepLease renews the run's lease every third of it while the run works, and
// stops the run when another run has taken the operation over, or when it
// could not renew the lease and the one it holds is about to run out (a run
// that went on past it could meet the run that takes the operation over). It
// arms a timer rather than start a goroutine: most runs end long before the
// first renewal.
func (r *run) keepLease(ctx context.Context) (stop func()) {
	lease := r.e.cfg.Lease
	every, margin := lease/3, lease/10
	r.mu.Lock()
	held := r.leaseFrom.Add(lease) // the lease runs out by then at the latest
	r.mu.Unlock()
	wasReserved := r.isReserved()
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	renew := func() {
		if ctx.Err() != nil {
			return
		}
		next := every
		if !wasReserved && r.isReserved() {
			// The reservation committed: its lease counts from when it was sent,
			// later than the run began.
			wasReserved = true
			r.mu.Lock()
			held = r.leaseFrom.Add(lease)
			r.mu.Unlock()
		}
		if !r.isReserved() && time.Until(held) <= margin {
			// The reservation has not committed in a lease (the database does
			// not answer): stop, so that nothing waits on it for ever. Should it
			// commit after all, its lease has expired, and a sweep resumes it.
			r.logger().ErrorContext(ctx, "the reservation did not commit within the lease; stopping the run")
			r.cancelRun(errLeaseExpiring)
			return
		}
		if !r.isReserved() {
			next = min(every, max(time.Until(held)-margin, time.Millisecond))
		} else {
			sent := time.Now()
			rctx, cancel := context.WithTimeout(ctx, min(every, time.Until(held)-margin))
			ok, err := r.e.store.OperationRenewLease(rctx, r.e.control, r.id, r.runID, lease)
			cancel()
			switch {
			case err != nil && ctx.Err() != nil:
				return // the run ended while renewing
			case err != nil:
				left := time.Until(held)
				if left <= margin {
					r.logger().ErrorContext(ctx, "could not renew the lease; stopping the run before it runs out", slog.Any("error", err))
					r.cancelRun(errLeaseExpiring)
					return
				}
				r.logger().WarnContext(ctx, "could not renew the lease; trying again", slog.Any("error", err), slog.Duration("left", left))
				next = min(every/4, left-margin)
			case !ok:
				r.cancelRun(errLost)
				return
			default:
				held = sent.Add(lease)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer.Reset(next)
		}
	}
	mu.Lock()
	// The first renewal comes a third of the lease from now, or sooner when
	// the claim was sent a while ago.
	timer = time.AfterFunc(min(every, max(time.Until(held)-margin-every, time.Millisecond)), renew)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
	}
}

// rollback ends a transaction that may already have ended; its error says nothing
// the caller does not know already.
func rollback(ctx context.Context, tx pgx.Tx) {
	_ = tx.Rollback(context.WithoutCancel(ctx))
}
