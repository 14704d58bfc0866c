package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

// Resolution is an operator's word on how the call of an operation's waiting
// or parked external step ended (see Engine.Resolve).
type Resolution struct {
	// Made says the call went through; false, that it did not.
	Made bool
	// Reference is the outside service's reference for what a made call made,
	// handed to the step's resolve function (ExternalStepDef.FromReference). Required when the step has one.
	Reference string
	// Reason says why, for the audit and the logs. Required.
	Reason string
	// Failure, for a call not made, is the answer the operation ends with
	// (made with Fail): a business answer, where the operation has one for a
	// call that did nothing ("not charged"). Nil: CodeResolvedNotMade, a
	// server fault. Ignored for a made call.
	Failure *PermanentError
}

// Resolve closes, on an operator's word, what the engine cannot decide alone:
// an operation in progress whose first unfinished step calls out and either
// waits for its outcome past its outcome window or is parked. "Made" (with the
// reference of what it made) succeeds the step, resolved by the operator
// (ResolvedByOperator), and the operation goes forward; "not made" fails the
// step and the operation compensates and ends failed (CodeResolvedNotMade).
// The step's lookup is asked first: when it answers, it must agree (a made
// call found under the key, with the same reference; a call not made found
// nowhere), else ErrResolutionContradicts, changing nothing; when it cannot
// answer, the operator's word is taken. What follows runs here, as Cancel's
// compensations do, and Resolve returns the operation as it is then.
//
// It returns ErrNotResolvable for an operation that is not so, ErrRunning when
// a live run holds it, ErrNotFound when there is none, and an error naming the
// field for a Resolution without a Reason, or without a Reference for a made
// call of a step with a resolve function.
func (e *Engine) Resolve(ctx context.Context, id uuid.UUID, res Resolution) (*Info, error) {
	info, err := e.resolve(ctx, id, res)
	made := res.Made
	detail := "resolved: the call was not made"
	if made {
		detail = "resolved: the call was made"
		if res.Reference != "" {
			detail += " under reference " + res.Reference
		}
	}
	return info, e.audit(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionResolve), Reason: res.Reason, Made: &made, Reference: res.Reference}, detail, err)
}

func (e *Engine) resolve(ctx context.Context, id uuid.UUID, res Resolution) (*Info, error) {
	if res.Reason == "" {
		return nil, fmt.Errorf("engine: resolve %s: %w: a reason is required", id, ErrInvalidResolution)
	}
	rec, err := e.store.OperationGet(ctx, e.pool, id)
	if err != nil {
		return nil, mapNotFound(err)
	}
	if rec.State != store.OperationInProgress {
		return nil, fmt.Errorf("engine: resolve %s: %w: it has finished", id, ErrNotResolvable)
	}
	req := operatorClaim(rec)
	req.resolve = &res
	_, err = e.claimAndRun(ctx, id, rec.Name, req, false, nil)
	switch {
	case errors.Is(err, errNotClaimed):
		return nil, fmt.Errorf("engine: resolve %s: %w", id, ErrRunning)
	case errors.Is(err, ErrNotResolvable), errors.Is(err, ErrResolutionContradicts), errors.Is(err, ErrInvalidResolution):
		return nil, err
	case errors.Is(err, store.ErrOutcomeSucceeded):
		return nil, fmt.Errorf("engine: resolve %s: %w: the outside service reported the call succeeded", id, ErrResolutionContradicts)
	case errors.Is(err, store.ErrMayLand):
		return nil, fmt.Errorf("engine: resolve %s: %w: its last request may still land: %w", id, ErrNotResolvable, err)
	case err != nil && !errors.Is(err, errHandedOff) && !errors.Is(err, errParked):
		return nil, fmt.Errorf("engine: resolve %s: %w", id, err)
	}
	return e.Get(ctx, id)
}

// resolveStep applies res to the operation's first unfinished step, which
// must call out and wait past its outcome window or be parked. For a made call
// it queues the step's checkpoint; for one not made it returns the failure
// record to compensate with.
func (r *run) resolveStep(ctx context.Context, parked bool, res *Resolution) (*store.StepRecordFailureParams, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("engine: resolve %s: %w: "+format, append([]any{r.id, ErrNotResolvable}, args...)...)
	}
	if r.failure != nil {
		return nil, refuse("it is compensating")
	}
	if r.undecodable != nil {
		return nil, refuse("its input or state does not decode: %w", r.undecodable)
	}
	i, st := -1, (*stepDef)(nil)
	for k, s := range r.steps {
		if r.status[r.stepName(k)] != store.StepSucceeded {
			i, st = k, s
			break
		}
	}
	switch {
	case st == nil:
		return nil, refuse("it has no unfinished step this process can run")
	case st.kind != StepKindExternal:
		return nil, refuse("its first unfinished step, %s, does not call out", st.name)
	case !parked && r.status[st.name] != store.StepWaiting:
		return nil, refuse("step %s is not waiting for its outcome, and the operation is not parked", st.name)
	}
	if !parked {
		end, left, err := r.settleLeft(ctx, st)
		if err != nil {
			return nil, err
		}
		if left > 0 {
			return nil, refuse("step %s's outcome window runs until %s: its lookup decides until then",
				st.name, end.UTC().Format(time.RFC3339))
		}
	}
	if f := res.Failure; f != nil && !res.Made && (f.Code == "" || f.Message == "") {
		return nil, fmt.Errorf("engine: resolve %s: %w: the answer for a call not made needs a code and a message", r.id, ErrInvalidResolution)
	}
	if res.Made && st.resolve != nil && res.Reference == "" {
		return nil, fmt.Errorf("engine: resolve %s: %w: step %s needs the reference of what the call made", r.id, ErrInvalidResolution, st.name)
	}
	contradicts := func(format string, args ...any) error {
		return fmt.Errorf("engine: resolve %s: %w: "+format, append([]any{r.id, ErrResolutionContradicts}, args...)...)
	}
	attempt := max(r.tries[st.name], 1)
	box, err := r.readInbox(ctx, st)
	if err != nil {
		return nil, err
	}
	if o := box.succeeded; o != nil && (!res.Made || st.resolve != nil && o.Reference != "" && o.Reference != res.Reference) {
		return nil, contradicts("the outside service reported step %s's call succeeded under reference %s (event %s)", st.name, o.Reference, o.EventID)
	}
	// The operator's state: the step's as it was, with the reference recorded.
	mine, err := r.def.decodeState(r.stateRaw)
	if err != nil {
		return nil, err
	}
	if res.Made && st.resolve != nil {
		if err := protect(func() error { return st.resolve(r.in, mine, res.Reference) }); err != nil {
			return nil, fmt.Errorf("engine: resolve %s: %w: the reference: %w", r.id, ErrInvalidResolution, err)
		}
	}
	state := mine
	if st.lookup != nil {
		if err := r.restoreState(); err != nil {
			return nil, err
		}
		found, lerr := r.lookup(ctx, st, r.attempt(st, attempt))
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		answer, pe, halt := readLookup(found, lerr)
		switch {
		case answer == answerFound && !res.Made:
			return nil, contradicts("step %s's lookup finds the call under its key", st.name)
		case answer == answerFound:
			got, _ := json.Marshal(r.state)
			want, _ := json.Marshal(mine)
			if st.resolve != nil && !bytes.Equal(got, want) {
				return nil, contradicts("step %s's lookup finds another call under its key than the one named (%s)", st.name, res.Reference)
			}
			state = r.state
		case answer == answerNothing && res.Made:
			return nil, contradicts("step %s's lookup finds nothing under its key", st.name)
		case answer == answerPending:
			return nil, contradicts("the outside service is still processing step %s's call", st.name)
		case answer == answerHalted && res.Made && parked && res.Reference != "":
			// The way out of a halt: the operator accepts what the service
			// made under the key (its reference) as the call's outcome,
			// knowing it is not what was asked; reconciliation keeps
			// showing how it differs.
			r.logger().WarnContext(ctx, "the operator accepts the outside service's record under the key, which is not the call asked for",
				slog.String("step", st.name), slog.String("halt", halt.Message), slog.String("reference", res.Reference))
		case answer == answerHalted && res.Made && parked:
			return nil, contradicts("step %s's lookup finds a call under its key that is not the one asked for (%s: %s); to accept it as made, name its reference",
				st.name, halt.Code, halt.Message)
		case answer == answerHalted:
			return nil, contradicts("step %s's lookup finds a call under its key that is not the one asked for: %s", st.name, halt.Message)
		case answer == answerFailed && res.Made:
			return nil, contradicts("step %s's lookup finds that the call failed: %s", st.name, pe.Message)
		case answer == answerNone:
			r.logger().WarnContext(ctx, "the lookup cannot answer; the operator's word is taken",
				slog.String("step", st.name), slog.Any("error", lerr))
		}
	}
	r.logger().InfoContext(ctx, "an operator resolved the step", slog.String("step", st.name),
		slog.Bool("made", res.Made), slog.String("reference", res.Reference), slog.String("reason", res.Reason))
	if res.Made {
		r.state = state
		return nil, r.succeeded(i, st, attempt, time.Now(), ResolvedByOperator)
	}
	if end, left, err := r.settleLeft(ctx, st); err != nil {
		return nil, err
	} else if left > 0 {
		// Nothing was found, or nothing can tell: either way the last request
		// may still land until the window has passed.
		return nil, refuse("step %s's last request may still land until %s: not made cannot be said before",
			st.name, end.UTC().Format(time.RFC3339))
	}
	if err := r.restoreState(); err != nil {
		return nil, err
	}
	r.refuseNotMade(st, true)
	pe := fault(CodeResolvedNotMade, st.name, fmt.Sprintf("an operator resolved step %s as not made: %s", st.name, res.Reason))
	if f := res.Failure; f != nil {
		pe = &PermanentError{Code: f.Code, Message: f.Message, Details: f.Details, Step: st.name, Fault: f.ServerFault(),
			Cause: fmt.Sprintf("an operator resolved step %s as not made: %s", st.name, res.Reason)}
	}
	r.failure = pe
	r.status[st.name] = store.StepFailed
	return &store.StepRecordFailureParams{
		OperationID: r.id, Name: st.name, Position: i, State: store.StepFailed, Attempts: r.tries[st.name],
		LastError: pe.Message, LastCause: pe.Error(), StartedAt: time.Now(),
	}, nil
}
