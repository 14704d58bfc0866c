package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemflow/idemflow/store"
)

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
		r.observeStep(ctx, st, attempt, started, AttemptFailed, stepErr)
		return r.park(ctx, failure, AttentionCode(halt.Code), fmt.Sprintf("step %s: %s", st.name, halt.Message))
	}
	var pe *PermanentError
	permanent := errors.As(stepErr, &pe)
	policy := st.retry
	if st.kind == StepKindTx && !permanent && IsUnavailable(stepErr) {
		// The database did not answer: nothing says the step is at fault, and
		// nothing left the process. The attempt is retried without counting.
		log.WarnContext(ctx, "step could not reach the database; retrying later without counting the attempt", slog.Any("error", stepErr))
		r.observeStep(ctx, st, attempt, started, AttemptRetried, stepErr)
		failure.Attempts = attempt - 1
		if r.failingSince == nil {
			r.failingSince = make(map[string]time.Time)
		}
		since, ok := r.failingSince[st.name]
		if !ok {
			since = started
			r.failingSince[st.name] = since
		}
		var need *attention
		if bound := max(policy.Cap, time.Minute); time.Since(since) > bound {
			// Not the step's fault, but nobody would see it otherwise.
			need = &attention{CodeDatabaseUnavailable, fmt.Sprintf("step %s has not reached the database for %s (since %s): %s",
				st.name, time.Since(since).Round(time.Second), since.UTC().Format(time.RFC3339), stepErr)}
		}
		return r.retryLater(ctx, failure, backoff(policy, attempt, stepErr), need)
	}
	if r.pastPivot() {
		if permanent {
			log.ErrorContext(ctx, "step failed for good after the point of no return; parking the operation", slog.String("error", stepErr.Error()))
			r.observeStep(ctx, st, attempt, started, AttemptFailed, stepErr)
			return r.park(ctx, failure, CodeFailedPastPivot,
				fmt.Sprintf("step %s failed for good after the point of no return: %s", st.name, pe.Error()))
		}
		if attempt < policy.MaxAttempts {
			log.InfoContext(ctx, "step failed; retrying later", slog.Any("error", stepErr))
			r.observeStep(ctx, st, attempt, started, AttemptRetried, stepErr)
			return r.retryLater(ctx, failure, backoff(policy, attempt, stepErr), nil)
		}
		log.WarnContext(ctx, "step keeps failing after the point of no return; retrying at the cap", slog.Any("error", stepErr))
		r.observeStep(ctx, st, attempt, started, AttemptRetried, stepErr)
		return r.retryLater(ctx, failure, policy.Cap, &attention{CodeRetryingPastPivot,
			fmt.Sprintf("step %s has failed %d times after the point of no return; retried every %s until it succeeds", st.name, attempt, policy.Cap)})
	}
	exhausted := !permanent && attempt >= policy.MaxAttempts
	if st.kind == StepKindExternal && (exhausted || permanent && pe.ServerFault()) {
		// Its call may have gone through, or may still: a business answer
		// (Fail) says it did not, a server fault or a run of failures does
		// not. It is called no more; only its lookup, by the derived key,
		// can tell, and "not found" counts only once no request can land.
		r.observeStep(ctx, st, attempt, started, AttemptRetried, stepErr)
		if st.lookup == nil {
			log.ErrorContext(ctx, "external step out of attempts, and no lookup can tell whether its call went through; parking the operation")
			now, window := time.Now(), st.settle
			failure.SentAt, failure.SettleWindow = &now, &window
			return r.park(ctx, failure, CodeOutcomeUnknown,
				fmt.Sprintf("step %s failed %d times and has no lookup: whether its call went through is unknown", st.name, attempt))
		}
		log.WarnContext(ctx, "external step out of attempts; its outcome is unknown, and it waits for it", slog.Any("error", stepErr))
		r.tries[st.name] = attempt
		r.status[st.name] = store.StepWaiting
		w := r.stepWait(st.name)
		w.sentAt, w.unrecorded, w.pending, w.cause = time.Now(), true, false, stepErr.Error()
		return r.awaitOutcome(ctx, i, st, started, i == len(r.steps)-1)
	}
	if exhausted {
		pe = fault(CodeAttemptsExhausted, st.name, fmt.Sprintf("step %s failed %d times; last error: %s", st.name, attempt, stepErr))
		permanent = true
	}
	if !permanent {
		delay := backoff(policy, attempt, stepErr)
		log.InfoContext(ctx, "step failed; retrying later", slog.Any("error", stepErr), slog.Duration("backoff", delay))
		r.observeStep(ctx, st, attempt, started, AttemptRetried, stepErr)
		if st.kind == StepKindExternal {
			now, window := time.Now(), st.settle
			failure.SentAt, failure.SettleWindow = &now, &window
			r.stepWait(st.name).sentAt = now
		}
		return r.retryLater(ctx, failure, delay, nil)
	}
	pe = &PermanentError{Code: pe.Code, Message: pe.Message, Cause: pe.Cause, Details: pe.Details, Step: st.name, Fault: pe.ServerFault()}
	log.InfoContext(ctx, "step failed permanently", slog.String("code", string(pe.Code)), slog.String("error", pe.Error()))
	r.observeStep(ctx, st, attempt, started, AttemptFailed, stepErr)
	r.failure = pe
	r.tries[st.name] = attempt
	r.status[st.name] = store.StepFailed
	failure.State = store.StepFailed
	failure.LastError, failure.LastCause = pe.Message, pe.Error()
	if pan := (*panicError)(nil); errors.As(stepErr, &pan) {
		failure.LastError = fmt.Sprintf("panic: step %s crashed in its last attempt; %s", st.name, pe.Message)
	}
	return r.compensateWith(ctx, failure)
}

// attention is why an operation needs an operator.
type attention struct {
	code   AttentionCode
	reason string
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
		ok, err := r.e.store.OperationSetAttention(ctx, tx, r.id, r.runID, string(need.code), need.reason)
		if err != nil {
			return nil, runError(err)
		}
		if !ok {
			return nil, errLost
		}
	}
	r.tries[failure.Name] = failure.Attempts
	r.markRowed(failure.Name)
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
func (r *run) park(ctx context.Context, failure *store.StepRecordFailureParams, code AttentionCode, reason string) (*Info, error) {
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if failure != nil {
		if err := r.e.store.StepRecordFailure(ctx, tx, *failure); err != nil {
			return nil, runError(err)
		}
		r.tries[failure.Name] = failure.Attempts
		r.markRowed(failure.Name)
	}
	return r.parkIn(ctx, tx, code, reason)
}

// parkIn parks the operation in tx, for code and reason, and commits tx with
// the pending checkpoints.
func (r *run) parkIn(ctx context.Context, tx *txn, code AttentionCode, reason string) (*Info, error) {
	ok, err := r.e.store.OperationPark(ctx, tx, r.id, r.runID, string(code), reason)
	if err != nil {
		return nil, runError(err)
	}
	if !ok {
		return nil, errLost
	}
	if err := r.commit(ctx, tx); err != nil {
		return nil, err
	}
	r.logger().WarnContext(ctx, "operation parked; it needs an operator (retry or cancel)", slog.String("code", string(code)), slog.String("reason", reason))
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
	runAt, ok, err := r.e.store.OperationRelease(ctx, tx, r.id, r.runID, delay, r.e.cfg.Lease, false)
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
	if err := r.e.enqueueResume(ctx, ptx, resumeArgs{OperationID: r.id, Operation: r.def.name, Scope: r.scope}, runAt); err != nil {
		return fmt.Errorf("engine: enqueue retry: %w", err)
	}
	if err := r.commit(ctx, tx); err != nil {
		return err
	}
	r.e.handedToRiver(ctx)
	return errHandedOff
}

// recordFailure records a step's permanent failure (when failure is not nil),
// and the operation's error once, so that a resumed run finishes the operation
// with it.
func (r *run) recordFailure(ctx context.Context, tx *txn, failure *store.StepRecordFailureParams) error {
	if nm := r.notMade; nm != nil {
		// First: it holds the key's lock, so that an outcome that arrives
		// now waits for this transaction, and one that came is seen.
		if err := r.e.store.OutcomeRefuseNotMade(ctx, tx, r.id, nm.step, nm.key, nm.bySilence); err != nil {
			return runError(err)
		}
	}
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
