package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

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
			return fmt.Errorf("engine: cancel %s: %w", r.id, &RefusedError{Refusal: ErrOutcomeUnknown, Step: name, Accepted: true,
				Reason: "the outside service accepted the call and has not settled it"})
		}
		if st.lookup == nil {
			// Whether its call went through is unknown, and undoing the steps
			// before it would be a guess (a compensation of its own would not
			// run: nothing says it succeeded).
			return fmt.Errorf("engine: cancel %s: %w: step %s may have called out, and has no lookup to tell", r.id, ErrPastPivot, name)
		}
		attempt := r.tries[name] + 1
		box, err := r.readInbox(ctx, st)
		if err != nil {
			return err
		}
		if o := box.succeeded; o != nil {
			return fmt.Errorf("engine: cancel %s: %w: the outside service reported step %s's call succeeded (event %s)", r.id, ErrPastPivot, name, o.EventID)
		}
		found, err := r.lookup(ctx, st, r.attempt(st, attempt))
		answer, _, halt := readLookup(found, err)
		switch answer {
		case answerPending:
			return fmt.Errorf("engine: cancel %s: %w", r.id, &RefusedError{Refusal: ErrOutcomeUnknown, Step: name, Accepted: true,
				Reason: "the outside service is still processing the call"})
		case answerFailed:
			r.refuseNotMade(st, false)
			return nil // the call ended without effect
		case answerHalted:
			// Something was made under the key: nothing may be undone as if
			// the call had not been.
			return fmt.Errorf("engine: cancel %s: %w: step %s's lookup finds a call under its key that is not the one asked for (%s: %s); "+
				"an operator may accept it as made, naming its reference (Resolve)", r.id, ErrPastPivot, name, halt.Code, halt.Message)
		case answerNone:
			return fmt.Errorf("engine: cancel %s: %w", r.id, &RefusedError{Refusal: ErrOutcomeUnknown, Step: name,
				Reason: "its lookup cannot answer: " + err.Error()})
		case answerNothing:
			end, left, err := r.settleLeft(ctx, st)
			if err != nil {
				return err
			}
			if left > 0 {
				return fmt.Errorf("engine: cancel %s: %w", r.id, &RefusedError{Refusal: ErrOutcomeUnknown, Step: name, KnownAt: end,
					Reason: "its last request may still land at the outside service"})
			}
			r.refuseNotMade(st, true)
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

// Cancel ends an operation in progress that no live run holds (it waits for a
// retry, it is parked, or its process died): the compensations of its succeeded
// steps run, last first, and it ends failed with code CodeCancelled, the reason
// as the operators' cause. It returns ErrRunning when a live run holds the
// operation (try again once its lease expires), ErrFinished when it has
// finished, and ErrPastPivot, changing nothing, when a step that cannot be
// undone has succeeded or may have: the first unfinished step's lookup is
// asked, by derived key, before anything is undone. Silence is no answer: an
// *RefusedError (ErrOutcomeUnknown), changing nothing, refuses an
// operation whose external step's last request may still land (its settle
// window has not passed since it was sent, or since the lease of a run that
// may have been sending it), whose call the outside service has pending, or
// whose lookup cannot answer. An operation whose input or
// state does not decode is cancelled only when nothing is to be compensated or
// looked up; else Cancel says so and changes nothing.
func (e *Engine) Cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	info, err := e.cancel(ctx, id, reason)
	detail := ""
	if info != nil {
		detail = "cancelled: " + string(info.Status)
	}
	if reason == "" {
		reason = defaultCancelReason
	}
	return info, e.audit(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionCancel), Reason: reason}, detail, err)
}

func (e *Engine) cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	rec, err := e.store.OperationGet(ctx, e.pool, id)
	if err != nil {
		return nil, mapNotFound(err)
	}
	if rec.State != store.OperationInProgress {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, ErrFinished)
	}
	if reason == "" {
		reason = defaultCancelReason
	}
	if def := e.def(rec.Name, rec.Version); def != nil {
		// Refused whoever holds it: a live run too only goes forward from here.
		steps, err := e.store.StepListByOperation(ctx, e.pool, id)
		if err != nil {
			return nil, fmt.Errorf("engine: cancel %s: %w", id, err)
		}
		for _, st := range steps {
			if st.State == store.StepSucceeded && def.cannotUndo(st.Name) {
				return nil, fmt.Errorf("engine: cancel %s: %w: step %s cannot be undone and has succeeded", id, ErrPastPivot, st.Name)
			}
		}
	}
	cancelled := &PermanentError{Code: CodeCancelled, Message: "the operation was cancelled by an operator", Cause: reason}
	req := operatorClaim(rec)
	req.err = cancelled
	info, err := e.claimAndRun(ctx, id, rec.Name, req, false, nil)
	if errors.Is(err, errNotClaimed) {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, ErrRunning)
	}
	if errors.Is(err, ErrPastPivot) || errors.Is(err, errCannotCancel) || errors.Is(err, ErrOutcomeUnknown) {
		return nil, err
	}
	// What the transaction that would have compensated found at the last
	// moment (an outcome that arrived meanwhile): nothing was undone.
	if errors.Is(err, store.ErrOutcomeSucceeded) {
		return nil, fmt.Errorf("engine: cancel %s: %w: the outside service reported the call succeeded: %w", id, ErrPastPivot, err)
	}
	if open := (*store.SettleOpenError)(nil); errors.As(err, &open) {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, &RefusedError{Refusal: ErrOutcomeUnknown, KnownAt: open.Until,
			Reason: "its last request may still land at the outside service"})
	}
	if err != nil {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, err)
	}
	return info, nil
}

// defaultCancelReason is a cancel's reason when the operator gives none.
const defaultCancelReason = "cancelled by an operator"
