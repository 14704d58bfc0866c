package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// stepWait is what a run knows of an external step whose outcome is not
// known: when its last request was sent at the latest, whether the outside
// service accepted it as pending (and under which reference), and since when
// it waits.
type stepWait struct {
	sentAt  time.Time
	pending bool
	since   time.Time
	// settleBy is the step's stored settle_by (zero: none stored).
	settleBy time.Time
	// unrecorded: this run sent a request whose settle_by is not stored yet.
	unrecorded bool
	// reference is the outside service's reference of the pending call.
	reference string
	// cause is the operators' text of why it waits, for its record.
	cause string
}

// lookupAnswer is what a step's lookup said of its call: the one reading of
// found and the lookup's error that awaitOutcome, mayCancel and resolveStep
// decide on.
type lookupAnswer int

const (
	// answerFound: the call went through (the lookup filled the state).
	answerFound lookupAnswer = iota
	// answerNothing: nothing under the key, which decides only once no
	// request can land any more (settleEnd).
	answerNothing
	// answerPending: the service has the call, with no final outcome yet.
	answerPending
	// answerFailed: the call ended without effect (a business answer, Fail).
	answerFailed
	// answerHalted: something under the key that is not the call asked for.
	answerHalted
	// answerNone: the lookup could not answer.
	answerNone
)

// readLookup reads a lookup's found and error as a lookupAnswer, with the
// business failure or the halt that it carries.
func readLookup(found bool, err error) (lookupAnswer, *PermanentError, *HaltError) {
	var pe *PermanentError
	var halt *HaltError
	switch {
	case err == nil && found:
		return answerFound, nil, nil
	case err == nil:
		return answerNothing, nil, nil
	case errors.As(err, &halt):
		return answerHalted, nil, halt
	case errors.Is(err, errAccepted):
		return answerPending, nil, nil
	case errors.As(err, &pe) && !pe.ServerFault():
		return answerFailed, pe, nil
	}
	return answerNone, nil, nil
}

// stepWait returns the wait record of the step named name, made when missing.
func (r *run) stepWait(name string) *stepWait {
	if r.waits == nil {
		r.waits = make(map[string]*stepWait)
	}
	w := r.waits[name]
	if w == nil {
		w = &stepWait{}
		r.waits[name] = w
	}
	return w
}

// markRowed notes that the step named name has a row of its own.
func (r *run) markRowed(name string) {
	if r.rowed == nil {
		r.rowed = make(map[string]bool)
	}
	r.rowed[name] = true
}

// settleLeft returns when a request of st that got no definite answer can
// no longer land, and how long that is from now, both by the database's
// clock: the step's settle_by, stored when its request was sent; the
// operation's calls_until (a run may have been calling out until then) plus
// its stored outcome window; the lease of a run that held it when Cancel or
// Resolve claimed it (heldUntil) plus that window; and a request this run sent
// whose settle_by is not stored yet. A left of zero or less: it has passed;
// a zero until: no request is known to have been sent.
func (r *run) settleLeft(ctx context.Context, st *stepDef) (time.Time, time.Duration, error) {
	t, err := r.e.store.OperationSettleBy(ctx, r.e.pool, r.id, st.name, st.settle)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("engine: read step %s's outcome window: %w", st.name, err)
	}
	until := t.Until
	later := func(end time.Time) {
		if end.After(until) {
			until = end
		}
	}
	if !r.heldUntil.IsZero() {
		later(r.heldUntil.Add(max(t.Window, st.settle)))
	}
	if w := r.waits[st.name]; w != nil && !w.sentAt.IsZero() && (w.unrecorded || w.settleBy.IsZero()) {
		// Known by this process's clock only (a request just sent, or a row
		// from before settle_by was stored): carried to the database's.
		later(t.Now.Add(time.Until(w.sentAt.Add(st.settle))))
	}
	if until.IsZero() {
		return until, 0, nil
	}
	return until, until.Sub(t.Now), nil
}

// pendingOutcome begins the wait of an external step whose call the outside
// service accepted without a final outcome (or whose lookup found it still
// being processed): the attempt counts as a call, and the operation is handed
// back until the lookup is asked again, or an event or an operator settles it.
func (r *run) pendingOutcome(ctx context.Context, i int, st *stepDef, attempt int, started time.Time, cause error) (*Info, error) {
	r.observeStep(ctx, st, attempt, started, AttemptAccepted, cause)
	r.logger().InfoContext(ctx, "external step's outcome is pending; waiting for it",
		slog.String("step", st.name), slog.Int("attempt", attempt), slog.Any("reason", cause))
	r.tries[st.name] = attempt
	r.status[st.name] = store.StepWaiting
	w := r.stepWait(st.name)
	w.sentAt, w.unrecorded, w.pending, w.cause = time.Now(), true, true, cause.Error()
	if ref := pendingReference(cause); ref != "" {
		w.reference = ref
	}
	return r.waitOn(ctx, i, st, started, false)
}

// awaitOutcome decides a step that waits for its outcome. The engine's inbox
// is read first: a success the outside service reported under the step's key
// goes forward (ResolvedByEvent). Else its lookup is asked: found goes
// forward; a final failure (Fail) fails the step and compensates; nothing
// found goes by a failure in the inbox, or, with none, means the call was not
// made once its outcome window has passed by the database's clock, and the
// operation fails and compensates; anything else (still pending, nothing found
// within the window, a lookup that cannot answer) waits on.
func (r *run) awaitOutcome(ctx context.Context, i int, st *stepDef, started time.Time, last bool) (*Info, error) {
	name := st.name
	w := r.stepWait(name)
	attempt := r.tries[name]
	log := r.logger().With(slog.String("step", name), slog.Int("attempt", attempt))
	box, err := r.readInbox(ctx, st)
	if err != nil {
		return nil, err
	}
	if box.succeeded != nil {
		return r.outcomeSucceeded(ctx, i, st, attempt, started, box.succeeded, last)
	}
	for _, o := range box.others {
		log.WarnContext(ctx, "an outcome under the step's key names another reference than its pending call; it is not the step's",
			slog.String("reference", o.Reference), slog.String("pending_reference", w.reference), slog.String("event_id", o.EventID))
	}
	if st.lookup == nil {
		if box.failed != nil {
			// Nothing can contradict the service's word.
			return r.waitFailed(ctx, i, st, started, outcomeFailure(box.failed), false)
		}
		if !w.pending {
			return r.park(ctx, r.waitRecord(i, st, started, ""), CodeOutcomeUnknown,
				fmt.Sprintf("step %s has no lookup: whether its call went through is unknown", name))
		}
		// Only an event or an operator can settle it.
		return r.waitOn(ctx, i, st, started, false)
	}
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	found, err := r.lookup(ctx, st, r.attempt(st, attempt))
	if cause := context.Cause(ctx); cause != nil {
		return nil, cause
	}
	// What the lookup may have put in the state stays only when it found the
	// call; every other way ends the run (a hand-off, a park) or compensates
	// from the state restored.
	answer, pe, halt := readLookup(found, err)
	switch {
	case answer == answerHalted:
		rec := r.waitRecord(i, st, started, err.Error())
		rec.LastError = publicText(name, err)
		return r.park(ctx, rec, AttentionCode(halt.Code), fmt.Sprintf("step %s: %s", name, halt.Message))
	case answer == answerFound:
		return r.externalSucceeded(ctx, i, st, attempt, started, ResolvedByLookup, last)
	case answer == answerPending:
		// A failure reported meanwhile is contradicted: the service still
		// has the call.
		w.pending, w.cause = true, err.Error()
		if ref := pendingReference(err); ref != "" && w.reference == "" {
			w.reference = ref
		}
		return r.waitOn(ctx, i, st, started, false)
	case answer == answerFailed:
		// The call ended without effect: the step failed, with that answer.
		log.InfoContext(ctx, "lookup found the call's final outcome: it failed", slog.String("code", string(pe.Code)))
		return r.waitFailed(ctx, i, st, started, pe, false)
	case answer == answerNone:
		// A failure reported meanwhile is weighed again at the next lookup.
		log.WarnContext(ctx, "lookup of a step waiting for its outcome failed; asking again later", slog.Any("error", err))
		w.cause = err.Error()
		return r.waitOn(ctx, i, st, started, true)
	case box.failed != nil:
		// Nothing found under the key, and the service reported the call
		// failed: its word, which the lookup does not contradict.
		log.InfoContext(ctx, "the outside service reported the call failed, and its lookup finds nothing to the contrary",
			slog.String("event_id", box.failed.EventID))
		return r.waitFailed(ctx, i, st, started, outcomeFailure(box.failed), false)
	case w.pending:
		// The service said it had the call, and now finds nothing: not an
		// answer to act on.
		log.WarnContext(ctx, "lookup finds nothing for a call the service accepted as pending; asking again later")
		w.cause = "the lookup finds nothing under the key of a call that was accepted as pending"
		return r.waitOn(ctx, i, st, started, true)
	}
	if _, left, err := r.settleLeft(ctx, st); err != nil {
		return nil, err
	} else if left > 0 {
		return r.waitOn(ctx, i, st, started, false)
	}
	log.InfoContext(ctx, "nothing found under the step's key after its outcome window: its call was not made")
	return r.waitFailed(ctx, i, st, started, fault(CodeAttemptsExhausted, name,
		fmt.Sprintf("step %s failed %d times, and nothing was found under its key after its outcome window (%s); last error: %s",
			name, attempt, st.settle, w.cause)), true)
}

// outcomeSucceeded succeeds a waiting step by the success that the inbox
// holds under its key, once it is the call asked for (the step's reconcile
// function), recording its reference as the step would have (its resolve
// function). One that is not the call asked for parks the operation: it is
// no success, and nothing may be undone on a guess either.
func (r *run) outcomeSucceeded(ctx context.Context, i int, st *stepDef, attempt int, started time.Time, o *store.Outcome, last bool) (*Info, error) {
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	mismatch := func(why string) (*Info, error) {
		reason := fmt.Sprintf("step %s: the outside service reported a call under its key (%s, event %s) that is not the one asked: %s",
			st.name, o.Reference, o.EventID, why)
		r.logger().ErrorContext(ctx, "an outcome under the step's key is not the call asked; parking the operation",
			slog.String("step", st.name), slog.String("reason", reason))
		return r.park(ctx, r.waitRecord(i, st, started, reason), CodeReconciliationMismatch, reason)
	}
	if st.reconcile != nil {
		var kind reconcile.Kind
		if err := protect(func() error { kind = st.reconcile(r.in, outcomeRecord(o)); return nil }); err != nil {
			return mismatch(err.Error())
		}
		if kind != "" {
			return mismatch(string(kind))
		}
	}
	if st.resolve != nil {
		if err := protect(func() error { return st.resolve(r.in, r.state, o.Reference) }); err != nil {
			return mismatch(err.Error())
		}
	}
	r.logger().InfoContext(ctx, "the outside service reported the step's call succeeded; going forward",
		slog.String("step", st.name), slog.String("event_id", o.EventID), slog.String("reference", o.Reference))
	return r.externalSucceeded(ctx, i, st, attempt, started, ResolvedByEvent, last)
}

// waitFailed fails a waiting step for good with pe and compensates: its call
// was not made, as the transaction that records it checks once more
// (notMade; bySilence: concluded from nothing found after the window).
func (r *run) waitFailed(ctx context.Context, i int, st *stepDef, started time.Time, pe *PermanentError, bySilence bool) (*Info, error) {
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	pe = &PermanentError{Code: pe.Code, Message: pe.Message, Cause: pe.Cause, Details: pe.Details, Step: st.name, Fault: pe.ServerFault()}
	r.failure = pe
	r.status[st.name] = store.StepFailed
	r.refuseNotMade(st, bySilence)
	rec := r.waitRecord(i, st, started, pe.Error())
	rec.State = store.StepFailed
	rec.LastError = pe.Message
	return r.compensateWith(ctx, rec)
}

// refuseNotMade makes the transaction that records that st's call was not
// made check it once more, serialised with the inbox's writers (see
// store.OutcomeRefuseNotMade).
func (r *run) refuseNotMade(st *stepDef, bySilence bool) {
	r.notMade = &notMade{step: st.name, key: r.attempt(st, max(r.tries[st.name], 1)).Key, bySilence: bySilence}
}

// notMade is a decision that an external step's call was not made, which the
// transaction that records it checks (recordFailure).
type notMade struct {
	step, key string
	bySilence bool
}

// waitRecord is the record of a step that waits for its outcome.
func (r *run) waitRecord(i int, st *stepDef, started time.Time, cause string) *store.StepRecordFailureParams {
	w := r.stepWait(st.name)
	if cause == "" {
		cause = w.cause
	}
	text := fmt.Sprintf("the outcome of step %s is not known yet; it waits for it", st.name)
	if w.pending {
		text = fmt.Sprintf("step %s was accepted and waits for its final outcome", st.name)
	}
	rec := &store.StepRecordFailureParams{
		OperationID: r.id, Name: st.name, Position: i, State: store.StepWaiting,
		Attempts: r.tries[st.name], LastError: text, LastCause: cause, StartedAt: started, Pending: w.pending,
		DerivedKey: r.attempt(st, r.tries[st.name]).Key, Reference: w.reference,
	}
	if !w.sentAt.IsZero() {
		sent := w.sentAt
		rec.SentAt = &sent
	}
	if w.unrecorded {
		window := st.settle
		rec.SettleWindow = &window
	}
	return rec
}

// waitOn records that the step waits for its outcome and hands the operation
// back until its lookup is asked again: at the step's backoff, growing with the
// time waited, at most ten times its base (and its cap), and once more just
// after its outcome window. No run holds it meanwhile. Past the window (or with
// a lookup that cannot answer past it) it needs attention.
func (r *run) waitOn(ctx context.Context, i int, st *stepDef, started time.Time, lookupFailed bool) (*Info, error) {
	w := r.stepWait(st.name)
	now := time.Now()
	if w.since.IsZero() {
		w.since = now
	}
	p := st.retry
	delay := min(max(now.Sub(w.since), p.Base), 10*p.Base, p.Cap)
	if st.lookup == nil {
		// Nothing to poll: an event or an operator settles it. The
		// operation is looked at again after the window, to mark it.
		delay = max(p.Cap, time.Minute)
	}
	end, left, err := r.settleLeft(ctx, st)
	if err != nil {
		return nil, err
	}
	if left > 0 && left < delay {
		delay = left + settleMargin
	}
	var need *attention
	if !end.IsZero() && left <= 0 {
		reason := fmt.Sprintf("step %s has waited for its outcome past its outcome window (%s)", st.name, st.settle)
		switch {
		case lookupFailed:
			reason += "; its lookup cannot answer: " + w.cause
		case w.pending:
			reason += "; the outside service has not settled it"
		}
		need = &attention{CodeOutcomeOverdue, reason}
	}
	rec := r.waitRecord(i, st, started, "")
	tx := r.begin(ctx)
	defer tx.end(ctx)
	if err := r.e.store.StepRecordFailure(ctx, tx, *rec); err != nil {
		return nil, runError(err)
	}
	w.unrecorded = false
	r.markRowed(st.name)
	if need != nil {
		ok, err := r.e.store.OperationSetAttention(ctx, tx, r.id, r.runID, string(need.code), need.reason)
		if err != nil {
			return nil, runError(err)
		}
		if !ok {
			return nil, errLost
		}
	}
	r.logger().InfoContext(ctx, "step waits for its outcome; the operation is handed back until it is asked again",
		slog.String("step", st.name), slog.Bool("pending", w.pending), slog.Duration("next_lookup", delay))
	return nil, r.handOff(ctx, tx, delay)
}

// settleMargin puts the lookup after a outcome window just after its end.
const settleMargin = 50 * time.Millisecond
