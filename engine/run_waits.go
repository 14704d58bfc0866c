package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/store"
)

// runWaitStep runs a step that waits for a signal, a moment or approvals.
// Its wait is fixed when it is first reached (WaitReach). Then, in one
// transaction that the run's fence begins (so that a signal being sent,
// which locks the operation's row, is seen, or waits for the decision), it
// reads the signals kept for the operation and decides: the signal applied,
// the moment come, the approvals complete, a rejection, the deadline passed;
// or else it hands the operation back, due at the deadline if there is one,
// with no run, lease or River job busy on it until then or until a signal
// wakes it.
func (r *run) runWaitStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	w := st.wait
	attempt := r.tries[st.name] + 1
	started := time.Now()
	ctx = r.startStep(ctx, st, attempt)
	var until Deadline
	need := 0
	if err := protect(func() error {
		if w.until != nil {
			until = w.until(r.in, r.state)
		}
		if w.need != nil {
			need = max(w.need(r.in, r.state), 0)
		}
		return nil
	}); err != nil {
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	tx := r.begin(ctx)
	defer tx.end(ctx)
	reachedBefore := r.rowed[st.name] || r.status[st.name] == store.StepWaiting
	if !reachedBefore && (w.reason == WaitTimer && until.IsZero() || w.reason == WaitApproval && need == 0) {
		// Nothing to wait for. Its checkpoint commits before the next step
		// runs all the same: a process whose definition asked for a wait
		// must not find the steps after it begun.
		return r.waitSucceeded(ctx, tx, i, st, attempt, started, last, nil)
	}
	wait := store.Wait{OperationID: r.id, Step: st.name, Position: i, Reason: string(w.reason), Signal: w.signal, Need: need}
	if !until.At.IsZero() {
		at := until.At
		wait.At = &at
	} else if until.After != 0 {
		after := until.After
		wait.After = &after
	}
	reached, err := r.e.store.WaitReach(ctx, tx, wait)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errLost // another run checkpointed it
	}
	if err != nil {
		return nil, runError(err)
	}
	r.markRowed(st.name)
	r.status[st.name] = store.StepWaiting
	var signals []store.Signal
	if w.signal != "" {
		names := []string{w.signal}
		if w.reason == WaitApproval {
			names = append(names, signalReject)
		}
		if signals, err = r.e.store.SignalList(ctx, tx, r.id, names); err != nil {
			return nil, runError(err)
		}
	}
	expired := reached.Until != nil && !reached.Now.Before(*reached.Until)
	log := r.logger().With(slog.String("step", st.name))
	switch w.reason {
	case WaitTimer:
		if reached.Until == nil || expired {
			log.InfoContext(ctx, "the timer's moment has come")
			return r.waitSucceeded(ctx, tx, i, st, attempt, started, last, reached)
		}
	case WaitSignal:
		if len(signals) > 0 {
			sig := signals[0]
			log.InfoContext(ctx, "applying the signal the step waits for", slog.String("signal", sig.Name), slog.String("signal_id", sig.ID))
			return r.waitApply(ctx, tx, i, st, attempt, started, last, reached, func(at Attempt) error {
				return w.apply(ctx, tx, at, r.in, r.state, Signal{ID: sig.ID, Name: sig.Name, Payload: sig.Payload, ReceivedAt: sig.ReceivedAt})
			})
		}
		if expired {
			log.InfoContext(ctx, "the step's deadline passed with no signal")
			if w.timeout == nil {
				return r.failWait(ctx, tx, i, st, attempt, started, reached,
					&PermanentError{Code: CodeSignalTimeout, Message: fmt.Sprintf("no %s signal came before the deadline", w.signal)})
			}
			return r.waitApply(ctx, tx, i, st, attempt, started, last, reached, func(at Attempt) error {
				return w.timeout(ctx, tx, at, r.in, r.state)
			})
		}
	case WaitApproval:
		approvers, rejection := approvalOutcome(signals, reached.Need)
		switch {
		case rejection != nil:
			log.InfoContext(ctx, "the operation was rejected", slog.String("actor", rejection.Actor))
			return r.failWait(ctx, tx, i, st, attempt, started, reached, &PermanentError{Code: FailureCode(w.rejected),
				Message: "the operation was rejected by an operator",
				Cause:   fmt.Sprintf("rejected by %s: %s", rejection.Actor, rejection.Reason)})
		case len(approvers) >= reached.Need:
			log.InfoContext(ctx, "the operation is approved", slog.String("approved_by", strings.Join(approvers, ", ")))
			return r.waitSucceeded(ctx, tx, i, st, attempt, started, last, reached)
		case expired:
			log.InfoContext(ctx, "the wait for approval expired", slog.Int("approvals", len(approvers)), slog.Int("needed", reached.Need))
			return r.failWait(ctx, tx, i, st, attempt, started, reached, &PermanentError{Code: FailureCode(w.expired),
				Message: "the operation was not approved in time",
				Cause: fmt.Sprintf("%d of %d approvals by %s", len(approvers), reached.Need,
					reached.Until.UTC().Format(time.RFC3339))})
		}
	}
	ok, err := r.e.store.OperationReleaseWait(ctx, tx, r.id, r.runID, reached.Until, r.e.cfg.Lease)
	if err != nil {
		return nil, runError(err)
	}
	if !ok {
		return nil, errLost
	}
	if err := r.commit(ctx, tx); err != nil {
		return nil, err
	}
	if reached.Until != nil {
		r.e.timers.soon(*reached.Until)
	}
	attrs := []any{slog.String("reason", string(w.reason))}
	if reached.Until != nil {
		attrs = append(attrs, slog.Time("until", *reached.Until))
	}
	log.InfoContext(ctx, "step waits; the operation is handed back with no process busy on it", attrs...)
	return nil, errHandedOff
}

// approvalOutcome reads the approvals and rejections kept, in the order they
// came: the distinct actors who approved until the need was met, or the
// rejection that came first.
func approvalOutcome(signals []store.Signal, need int) (approvers []string, rejection *store.Signal) {
	seen := make(map[string]bool)
	for k := range signals {
		s := &signals[k]
		if len(approvers) >= need {
			break
		}
		switch s.Name {
		case signalReject:
			return approvers, s
		case signalApprove:
			if !seen[s.Actor] {
				seen[s.Actor] = true
				approvers = append(approvers, s.Actor)
			}
		}
	}
	return approvers, nil
}

// waitApply runs fn (a signal's function, or a deadline's) in tx, and
// checkpoints the step with it: a failure of fn fails the attempt as a
// TxStep's does.
func (r *run) waitApply(ctx context.Context, tx *txn, i int, st *stepDef, attempt int, started time.Time, last bool,
	reached *store.Reached, fn func(at Attempt) error) (*Info, error) {
	err := protect(func() error {
		if err := r.hook(ctx, st, faults.PointBefore, attempt); err != nil {
			return err
		}
		if err := fn(r.attempt(st, attempt)); err != nil {
			return err
		}
		return r.hook(ctx, st, faults.PointAfterEffect, attempt)
	})
	if tx.failed != nil {
		return nil, runError(tx.failed)
	}
	if err != nil {
		tx.end(ctx)
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	return r.waitSucceeded(ctx, tx, i, st, attempt, started, last, reached)
}

// waitSucceeded checkpoints a wait step in tx and commits, as a TxStep's
// transaction does.
func (r *run) waitSucceeded(ctx context.Context, tx *txn, i int, st *stepDef, attempt int, started time.Time, last bool, reached *store.Reached) (*Info, error) {
	if reached != nil && st.wait.reason != WaitSignal {
		// A crash or a fault injected here: the wait decided, its
		// checkpoint not committed (a signal's is in waitApply).
		if err := protect(func() error { return r.hook(ctx, st, faults.PointAfterEffect, attempt) }); err != nil {
			tx.end(ctx)
			return r.stepFailed(ctx, i, st, attempt, started, err)
		}
	}
	info, err := r.commitStep(ctx, tx, i, st, attempt, started, last)
	if err == nil && reached != nil {
		r.observeWaited(ctx, st, attempt, reached)
	}
	return info, err
}

// failWait fails a wait step for good with pe (a rejection, an expiry, a
// deadline with no timeout function), and compensates the steps before it,
// as a business failure of a TxStep does. The wait as it was fixed commits
// first when this run fixed it, so that what comes later is refused for the
// right reason (ErrWaitOver).
func (r *run) failWait(ctx context.Context, tx *txn, i int, st *stepDef, attempt int, started time.Time, reached *store.Reached, pe *PermanentError) (*Info, error) {
	if reached.First {
		if err := r.commit(ctx, tx); err != nil {
			return nil, err
		}
	} else {
		tx.end(ctx)
	}
	r.observeWaited(ctx, st, attempt, reached)
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	pe.Step = st.name
	r.failure = pe
	r.status[st.name] = store.StepFailed
	r.observeStep(ctx, st, attempt, started, AttemptFailed, pe)
	return r.compensateWith(ctx, &store.StepRecordFailureParams{
		OperationID: r.id, Name: st.name, Position: i, State: store.StepFailed, Attempts: attempt,
		LastError: pe.Message, LastCause: pe.Error(), StartedAt: started,
	})
}

// observeWaited tells the observer how long a wait step waited, by the
// database's clock.
func (r *run) observeWaited(ctx context.Context, st *stepDef, attempt int, reached *store.Reached) {
	obs := r.e.cfg.Observer
	if obs == nil || obs.Waited == nil || reached.Since.IsZero() {
		return
	}
	ev := StepEvent{Operation: r.opEvent(), Step: st.name, Attempt: attempt}
	waited := max(reached.Now.Sub(reached.Since), 0)
	r.observed(ctx, "Waited", func() { obs.Waited(ctx, ev, st.wait.reason, waited) })
}
