package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/store"
)

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
		// A compensation marks its step's record, which a pending checkpoint
		// (an external step's, waiting for the next transaction) has not
		// written yet: commit them first, with the failure, which a resumed run then
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
		at := r.attempt(st, r.compensations[st.name]+1)
		err := protect(func() error {
			if err := r.hook(ctx, st, faults.PointBeforeCompensation, at.Number); err != nil {
				return err
			}
			if err := st.compensate(ctx, tx, at, r.in, r.state); err != nil {
				return err
			}
			return r.hook(ctx, st, faults.PointAfterCompensation, at.Number)
		})
		if err != nil {
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

// compensationFailed retries a compensation later, or, once the failed step's
// retry policy is spent (or the compensation failed permanently), parks the
// operation for an operator, half undone, rather than retrying forever.
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
		// Half undone: what this compensation undoes stands, and so do the
		// steps before it, whose compensations would undo what it may rely on.
		// An answer now would tell the client the operation is over; it stops
		// for an operator instead, whose retry goes on compensating.
		log.ErrorContext(ctx, "compensation failed for good; parking the operation", slog.Any("error", compErr))
		info, err := r.parkIn(ctx, tx, CodeCompensationFailed,
			fmt.Sprintf("compensation of step %s failed for good after %d attempts: %s; it and the compensations of the steps before it have not run (undoing after: %s)",
				st.name, n, publicText(st.name, compErr), r.failure.Error()))
		if !errors.Is(err, errParked) {
			r.failureStored = stored
		}
		return info, err
	}
	delay := backoff(st.retry, n, compErr)
	log.WarnContext(ctx, "compensation failed; retrying later", slog.Any("error", compErr), slog.Duration("backoff", delay))
	if err := r.handOff(ctx, tx, delay); !errors.Is(err, errHandedOff) {
		r.failureStored = stored
		return nil, err
	}
	return nil, errHandedOff
}
