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
// the operation: another run carries it on.
var (
	// errKeyTaken: the reservation found the key already taken.
	errKeyTaken = errors.New("idempotency key already taken")
	// errHandedOff: the run scheduled a River job to carry on after a backoff.
	errHandedOff = errors.New("handed off to a river job")
	// errRetryNow: the run waited out a short backoff itself; the step runs again.
	errRetryNow = errors.New("retry the step now")
	// errLost: another run recorded the work first; this run's lease had expired.
	errLost = errors.New("lease lost to another run")
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
	// steps are the steps to run, in the order the operation was started with. A
	// nil entry is a step this process's definition lacks (it had succeeded).
	steps []*stepDef
	in    any
	// state is the operation's *S; stateRaw is its encoding after the last step
	// that succeeded, from which state is restored when an attempt fails.
	state    any
	stateRaw []byte
	status   map[string]store.StepState
	// tries counts the recorded attempts of each step.
	tries map[string]int
	// failure is the permanent error of a failed step, once there is one.
	failure *PermanentError
	resumed bool
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
}

// execute runs the first attempt of a new operation.
func (r *run) execute(ctx context.Context) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r.cancelRun = cancel
	stopLease := r.keepLease(ctx)
	defer stopLease()

	info, err := r.runSteps(context.WithValue(ctx, operationIDKey{}, r.id))
	r.end(ctx, info, err)
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
	case errors.Is(err, errKeyTaken), errors.Is(err, errHandedOff):
	case errors.Is(err, errLost):
		r.logger().WarnContext(ctx, "run stopped: another run took the operation over")
	case errors.Is(err, context.Canceled) && r.isReserved():
		// The engine is stopping: hand the operation back at once, so that the next
		// sweep, here after a restart or in another process, resumes it without
		// waiting for the lease to expire.
		releaseCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, rerr := r.e.store.OperationRelease(releaseCtx, r.e.pool, r.id, r.runID, time.Now(), 0); rerr != nil {
			r.logger().WarnContext(ctx, "could not release the operation; it resumes once its lease expires", slog.Any("error", rerr))
		} else {
			r.logger().InfoContext(ctx, "run stopped with the engine; the operation resumes at the next sweep")
		}
	default:
		r.logger().ErrorContext(ctx, "run stopped; the operation resumes once its lease expires", slog.Any("error", err))
	}
	if r.local != nil {
		if !r.isReserved() {
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

func (r *run) existing(ctx context.Context) reservation {
	rec, err := r.e.store.OperationGetByKey(ctx, r.e.pool, r.scope, r.key)
	if err != nil {
		return reservation{err: fmt.Errorf("engine: read existing operation: %w", err)}
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
	tx := r.begin(ctx)
	defer tx.end(ctx)
	info, err := r.commitSuccess(ctx, tx)
	return r.resultOrFailure(ctx, info, err)
}

func (r *run) runTxStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	attempt := r.tries[st.name] + 1
	started := time.Now()
	tx := r.begin(ctx)
	defer tx.end(ctx)
	r.hook(ctx, st, PointBefore, attempt)
	err := st.tx(ctx, tx, r.in, r.state)
	if tx.failed != nil {
		// The engine's own statements sent with the step's failed: the step's
		// error says nothing about the step.
		return nil, runError(tx.failed)
	}
	if err != nil {
		tx.end(ctx)
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	r.hook(ctx, st, PointAfterEffect, attempt)
	prevState, prevStatus := r.stateRaw, r.status[st.name]
	// undo takes back what succeeded queued, for a transaction that committed
	// nothing after all.
	undo := func() {
		r.pending = r.pending[:len(r.pending)-1]
		r.stateRaw, r.status[st.name] = prevState, prevStatus
	}
	if err := r.succeeded(i, st, attempt, started); err != nil {
		tx.end(ctx)
		return r.stepFailed(ctx, i, st, attempt, started, Permanent(err))
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
		if err := r.restoreState(); err != nil {
			return nil, err
		}
		return r.resultFailed(ctx, re.err)
	}
	return info, err
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
	call := Call{
		Key:          DerivedKey(r.def.name, r.scope, r.key, st.name),
		OperationID:  r.id,
		Attempt:      attempt,
		Operation:    r.def.name,
		Step:         st.name,
		Scope:        r.scope,
		OperationKey: r.key,
	}
	r.hook(ctx, st, PointBefore, attempt)
	found := false
	// A resumed run cannot know whether the run before it called out: ask first.
	if st.lookup != nil && (r.resumed || attempt > 1) {
		var err error
		found, err = st.lookup(ctx, call, r.in, r.state)
		if err != nil {
			return r.stepFailed(ctx, i, st, attempt, started, fmt.Errorf("lookup: %w", err))
		}
		if found {
			r.logger().InfoContext(ctx, "lookup found the earlier attempt; not calling again",
				slog.String("step", st.name), slog.Int("attempt", attempt))
		}
	}
	if !found {
		if err := st.external(ctx, call, r.in, r.state); err != nil {
			return r.stepFailed(ctx, i, st, attempt, started, err)
		}
	}
	r.hook(ctx, st, PointAfterEffect, attempt)
	if err := r.succeeded(i, st, attempt, started); err != nil {
		return r.stepFailed(ctx, i, st, attempt, started, Permanent(err))
	}
	if !last {
		// Checkpointed with the next transaction, so that a first attempt commits
		// once before its call and once after.
		return nil, nil
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	info, err := r.commitSuccess(ctx, tx)
	return r.resultOrFailure(ctx, info, err)
}

// succeeded queues the checkpoint of a step whose effect has happened.
func (r *run) succeeded(i int, st *stepDef, attempt int, started time.Time) error {
	raw, err := json.Marshal(r.state)
	if err != nil {
		return fmt.Errorf("encode state after step %s: %w", st.name, err)
	}
	r.stateRaw = raw
	r.status[st.name] = store.StepSucceeded
	r.tries[st.name] = attempt
	r.pending = append(r.pending, store.StepCheckpointParams{
		Name:      st.name,
		Position:  i,
		Attempts:  attempt,
		Output:    raw,
		StartedAt: started,
		// Every attempt before this one failed and was recorded in the step's row.
		Retried: attempt > 1,
	})
	return nil
}

// stepFailed handles a failed attempt: a retry later, or the end of the operation.
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
	var pe *PermanentError
	if !errors.As(stepErr, &pe) && attempt >= st.retry.MaxAttempts {
		pe = &PermanentError{
			Code:    CodeAttemptsExhausted,
			Message: fmt.Sprintf("step %s failed %d times; last error: %s", st.name, attempt, stepErr),
		}
	}
	if pe != nil {
		pe = &PermanentError{Code: pe.Code, Message: pe.Message, Details: pe.Details, Step: st.name}
		log.InfoContext(ctx, "step failed permanently", slog.String("code", pe.Code), slog.String("error", pe.Message))
		r.failure = pe
		r.tries[st.name] = attempt
		r.status[st.name] = store.StepFailed
		return r.compensateWith(ctx, &store.StepRecordFailureParams{
			OperationID: r.id, Name: st.name, Position: i, State: store.StepFailed,
			Attempts: attempt, LastError: pe.Error(), StartedAt: started,
		})
	}

	delay := st.retry.Backoff(attempt)
	log.InfoContext(ctx, "step failed; retrying later", slog.Any("error", stepErr), slog.Duration("backoff", delay))
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if err := r.e.store.StepRecordFailure(ctx, tx, store.StepRecordFailureParams{
		OperationID: r.id, Name: st.name, Position: i, State: store.StepRetrying,
		Attempts: attempt, LastError: stepErr.Error(), StartedAt: started,
	}); err != nil {
		return nil, runError(err)
	}
	r.tries[st.name] = attempt
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

// handOff writes the pending checkpoints, gives the operation to a River job
// scheduled after delay, and commits.
func (r *run) handOff(ctx context.Context, tx *txn, delay time.Duration) error {
	runAt := time.Now().Add(delay)
	ok, err := r.e.store.OperationRelease(ctx, tx, r.id, r.runID, runAt, r.e.cfg.Lease)
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
	return errHandedOff
}

// compensate undoes the succeeded steps after a permanent failure, last first,
// and ends the operation failed.
func (r *run) compensate(ctx context.Context) (*Info, error) {
	return r.compensateWith(ctx, nil)
}

// compensateWith is compensate with a failure record that the first of its
// transactions commits.
func (r *run) compensateWith(ctx context.Context, failure *store.StepRecordFailureParams) (*Info, error) {
	var todo []*stepDef
	for i := len(r.steps) - 1; i >= 0; i-- {
		st := r.steps[i]
		if st != nil && st.compensate != nil && r.status[st.name] == store.StepSucceeded {
			todo = append(todo, st)
		}
	}
	if len(todo) > 0 && len(r.pending) > 0 {
		// A compensation marks its step's row, which a pending checkpoint (an
		// external step's, waiting for the next transaction) has not written
		// yet: commit them first, with the failure.
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
		tx := r.begin(ctx)
		defer tx.end(ctx)
		if err := r.recordFailure(ctx, tx, failure); err != nil {
			return nil, err
		}
		if err := st.compensate(ctx, tx, r.in, r.state); err != nil {
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

// recordFailure records a step's permanent failure, and the operation's error so
// that a resumed run finishes the operation with it.
func (r *run) recordFailure(ctx context.Context, tx *txn, failure *store.StepRecordFailureParams) error {
	if failure == nil {
		return nil
	}
	if err := r.e.store.StepRecordFailure(ctx, tx, *failure); err != nil {
		return runError(err)
	}
	raw, err := json.Marshal(r.failure)
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
	r.tries[st.name]++
	log := r.logger().With(slog.String("step", st.name))
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if err := r.recordFailure(ctx, tx, failure); err != nil {
		return nil, err
	}
	var pe *PermanentError
	if errors.As(compErr, &pe) || r.tries[st.name] >= st.retry.MaxAttempts {
		log.ErrorContext(ctx, "compensation failed for good", slog.Any("error", compErr))
		r.failure = &PermanentError{
			Code:    CodeCompensationFailed,
			Message: fmt.Sprintf("compensation of step %s failed: %s (after: %s)", st.name, compErr, r.failure.Message),
			Step:    r.failure.Step,
		}
		return r.commitFailure(ctx, tx)
	}
	delay := st.retry.Backoff(r.tries[st.name])
	log.WarnContext(ctx, "compensation failed; retrying later", slog.Any("error", compErr), slog.Duration("backoff", delay))
	return nil, r.handOff(ctx, tx, delay)
}

// begin makes the run's next transaction, which sends nothing yet; on a first
// attempt whose reservation has not committed, the reservation goes first.
func (r *run) begin(ctx context.Context) *txn {
	tx := newTxn(r.e.pool)
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
	result, err := r.def.result(r.in, r.state)
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

// resultOrFailure passes commitSuccess's answer on, or ends the operation
// failed when the result function failed.
func (r *run) resultOrFailure(ctx context.Context, info *Info, err error) (*Info, error) {
	if re := (*resultError)(nil); errors.As(err, &re) {
		return r.resultFailed(ctx, re.err)
	}
	return info, err
}

// resultFailed ends the operation failed with the result function's error,
// after the compensations of the steps that succeeded. The pending checkpoints
// stand: those steps did happen.
func (r *run) resultFailed(ctx context.Context, err error) (*Info, error) {
	last := r.steps[len(r.steps)-1]
	r.failure = &PermanentError{Code: CodeResultFailed, Message: err.Error(), Step: last.name}
	return r.compensate(ctx)
}

func (r *run) commitFailure(ctx context.Context, tx *txn) (*Info, error) {
	raw, err := json.Marshal(r.failure)
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

func (r *run) hook(ctx context.Context, st *stepDef, p Point, attempt int) {
	if r.e.cfg.Hook != nil {
		r.e.cfg.Hook(ctx, HookEvent{
			Operation: r.def.name, OperationID: r.id, Step: st.name, Point: p, Attempt: attempt, Resumed: r.resumed,
		})
	}
}

// keepLease renews the run's lease every third of it while the run works, and
// stops the run when another run has taken the operation over. It arms a timer
// rather than start a goroutine: most runs end long before the first renewal.
func (r *run) keepLease(ctx context.Context) (stop func()) {
	every := r.e.cfg.Lease / 3
	var (
		mu      sync.Mutex
		stopped bool
		timer   *time.Timer
	)
	renew := func() {
		if ctx.Err() != nil {
			return
		}
		if r.isReserved() {
			ok, err := r.e.store.OperationRenewLease(ctx, r.e.pool, r.id, r.runID, r.e.cfg.Lease)
			switch {
			case err != nil && ctx.Err() != nil:
				return // the run ended while renewing
			case err != nil:
				r.logger().WarnContext(ctx, "could not renew lease", slog.Any("error", err))
			case !ok:
				r.cancelRun(errLost)
				return
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			timer.Reset(every)
		}
	}
	mu.Lock()
	timer = time.AfterFunc(every, renew)
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
