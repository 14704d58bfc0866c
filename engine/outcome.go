package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// Outcome is an outside service's word on the call made under a derived
// key, as one of its messages (a webhook's event) tells it: see
// Engine.RecordOutcome.
type Outcome struct {
	// EventID names the message that carried it: the inbox keeps each
	// (Record.Key, EventID) once. Required.
	EventID string
	// Record is what the service says of the call: Key is the derived key it
	// was made under (required), Reference the service's id of what it made,
	// Amount and Data what the step's reconcile function compares with the
	// operation's input, Status Succeeded, Failed or Pending.
	Record reconcile.Record
	// Failure is the step's answer for a failed call (made with Fail): what
	// the operation ends with when the outcome settles the step. Required
	// when Record.Status is Failed.
	Failure *PermanentError
}

// RecordOutcome keeps o in the engine's inbox, in tx (the caller's: a
// webhook handler's, which commits the event with it), whatever the state of
// the step that holds o.Record.Key: not begun, calling, waiting or finished,
// and whichever definitions this process runs. It returns true when o is new,
// false when the inbox holds it already (a message delivered twice), and
// ErrEventReused when it holds another outcome under the same EventID.
//
// The outcome counts when the step waits for it, whenever it arrived: a
// success that matches the operation's input (the step's reconcile function)
// succeeds the step (ResolvedByEvent), and no "not made" is ever concluded,
// by its lookup, Cancel or Resolve, while the inbox holds a success under its
// key. A failure settles the step only when its lookup, asked then, does not
// contradict it (it finds the call pending or made: the step waits on; it
// cannot answer: the failure is weighed again at its next lookup). An outcome
// that names another reference than the service gave for the step's pending
// call is not the step's. When the step waits and no live run holds its
// operation, the operation is made due at once, to apply it.
func (e *Engine) RecordOutcome(ctx context.Context, tx pgx.Tx, o Outcome) (bool, error) {
	if tx == nil {
		return false, errors.New("engine: record outcome: no transaction given")
	}
	so, err := storedOutcome(o)
	if err != nil {
		return false, err
	}
	added, kept, err := e.store.OutcomeRecord(ctx, tx, so)
	if err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	if !added {
		if fields := outcomeDiff(kept, &so); len(fields) > 0 {
			return false, &ReusedError{What: "event", ID: o.EventID, Fields: fields}
		}
		return false, nil
	}
	if so.Status == string(reconcile.Pending) {
		return true, nil
	}
	id, step, err := e.store.StepWaitingByKey(ctx, tx, so.DerivedKey)
	if errors.Is(err, store.ErrNotFound) {
		// Not waiting: its run applies it when it gets there.
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	rec, err := e.store.OperationGetForUpdate(ctx, tx, id)
	if err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	if rec.State != store.OperationInProgress {
		return true, nil
	}
	if other, err := e.otherReference(ctx, tx, rec, step, so); err != nil || other {
		// Not the step's: it changes nothing, and is a mismatch at once.
		return err == nil, err
	}
	held, err := e.store.OperationHeld(ctx, tx, id)
	if err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	if held {
		// The live run reads the inbox before it decides, and a decision of
		// "not made" waits for this transaction (idemflow_refuse_not_made).
		return true, nil
	}
	if err := e.wake(ctx, tx, rec); err != nil {
		return false, err
	}
	e.logger.InfoContext(ctx, "outcome received for a waiting step; its operation is due at once",
		slog.String("operation_id", id.String()), slog.String("operation", rec.Name), slog.String("step", step),
		slog.String("status", so.Status))
	return true, nil
}

// otherReference reports whether so names another reference than the one
// the service gave for the pending call of the operation's waiting step; such
// an outcome is not the step's, and is kept as a ReferenceDiffers mismatch of
// the step's source (ExternalStepDef.Records) when this process knows it.
func (e *Engine) otherReference(ctx context.Context, tx pgx.Tx, rec *store.Operation, step string, so store.Outcome) (bool, error) {
	if so.Reference == "" {
		return false, nil
	}
	steps, err := e.store.StepListByOperation(ctx, tx, rec.ID)
	if err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	pending := ""
	for _, s := range steps {
		if s.Name == step {
			pending = s.Reference
		}
	}
	if pending == "" || pending == so.Reference {
		return false, nil
	}
	e.logger.WarnContext(ctx, "an outcome names another reference than the pending call of the step under its key; it is not the step's",
		slog.String("operation_id", rec.ID.String()), slog.String("step", step), slog.String("event_id", so.EventID),
		slog.String("reference", so.Reference), slog.String("pending_reference", pending))
	def := e.def(rec.Name, rec.Version)
	if def == nil {
		return true, nil
	}
	i, ok := def.index[step]
	if !ok || def.steps[i].source == "" {
		return true, nil
	}
	m := store.Mismatch{
		RecordKey: so.DerivedKey, Kind: string(reconcile.ReferenceDiffers), Reference: so.Reference, Amount: so.Amount,
		RecordStatus: so.Status, RecordCreatedAt: time.Now(), Data: so.Data, OperationID: rec.ID, Step: step,
		Detail: fmt.Sprintf("event %s names %s; the service answered %s for the pending call", so.EventID, so.Reference, pending),
	}
	if err := e.store.MismatchUpsert(ctx, tx, def.steps[i].source, []store.Mismatch{m}); err != nil {
		return false, fmt.Errorf("engine: record outcome: %w", err)
	}
	return true, nil
}

// storedOutcome checks o and returns it as the inbox keeps it.
func storedOutcome(o Outcome) (store.Outcome, error) {
	r := o.Record
	switch {
	case o.EventID == "":
		return store.Outcome{}, errors.New("engine: record outcome: an event id is required")
	case r.Key == "":
		return store.Outcome{}, errors.New("engine: record outcome: the record's key (the derived key) is required")
	}
	so := store.Outcome{DerivedKey: r.Key, EventID: o.EventID, Status: string(r.Status.OrDefault()), Reference: r.Reference, Amount: r.Amount}
	switch r.Status.OrDefault() {
	case reconcile.Succeeded, reconcile.Pending:
	case reconcile.Failed:
		if o.Failure == nil {
			return store.Outcome{}, errors.New("engine: record outcome: a failed outcome needs the step's answer (Failure)")
		}
		raw, err := json.Marshal(o.Failure.stored())
		if err != nil {
			return store.Outcome{}, fmt.Errorf("engine: record outcome: encode failure: %w", err)
		}
		so.Failure = raw
	default:
		return store.Outcome{}, fmt.Errorf("engine: record outcome: unknown status %q", r.Status)
	}
	if r.Data != nil {
		raw, err := json.Marshal(r.Data)
		if err != nil {
			return store.Outcome{}, fmt.Errorf("engine: record outcome: encode data: %w", err)
		}
		so.Data = raw
	}
	return so, nil
}

// outcomeDiff names the parts of the outcome o that differ from the kept
// one, sorted; none when o is the kept outcome again.
func outcomeDiff(kept, o *store.Outcome) []string {
	var fields []string
	if !jsonEqual(kept.Data, o.Data) {
		fields = append(fields, "data")
	}
	if kept.Amount != o.Amount {
		fields = append(fields, "amount")
	}
	if !jsonEqual(kept.Failure, o.Failure) {
		fields = append(fields, "failure")
	}
	if kept.Reference != o.Reference {
		fields = append(fields, "reference")
	}
	if kept.Status != o.Status {
		fields = append(fields, "status")
	}
	slices.Sort(fields)
	return fields
}

// jsonEqual compares two JSON texts as values (jsonb does not keep the
// bytes).
func jsonEqual(a, b json.RawMessage) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

// inbox is what the engine's inbox holds for a step: its first success and
// its first failure, each the step's (its reference is the pending call's,
// when the step has one); others names outcomes that are not the step's.
type inbox struct {
	succeeded *store.Outcome
	failed    *store.Outcome
	others    []store.Outcome
}

// readInbox reads what the inbox holds under st's derived key.
func (r *run) readInbox(ctx context.Context, st *stepDef) (inbox, error) {
	var in inbox
	key := r.attempt(st, max(r.tries[st.name], 1)).Key
	list, err := r.e.store.OutcomeListByKey(ctx, r.e.pool, key)
	if err != nil {
		return in, fmt.Errorf("engine: read the outcomes of step %s: %w", st.name, err)
	}
	ref := ""
	if w := r.waits[st.name]; w != nil {
		ref = w.reference
	}
	for k := range list {
		o := &list[k]
		if ref != "" && o.Reference != "" && o.Reference != ref {
			in.others = append(in.others, *o)
			continue
		}
		switch {
		case o.Status == string(reconcile.Succeeded) && in.succeeded == nil:
			in.succeeded = o
		case o.Status == string(reconcile.Failed) && in.failed == nil:
			in.failed = o
		}
	}
	return in, nil
}

// outcomeRecord is o as a reconcile.Record, for the step's reconcile
// function: its Data is the JSON kept (a json.RawMessage), nil when none.
func outcomeRecord(o *store.Outcome) reconcile.Record {
	rec := reconcile.Record{Key: o.DerivedKey, Reference: o.Reference, Amount: o.Amount, Status: reconcile.Status(o.Status), CreatedAt: o.ReceivedAt}
	if len(o.Data) > 0 {
		rec.Data = o.Data
	}
	return rec
}

// outcomeFailure is the step's answer that a failed outcome carries.
func outcomeFailure(o *store.Outcome) *PermanentError {
	pe := &PermanentError{}
	if len(o.Failure) == 0 || json.Unmarshal(o.Failure, pe) != nil || pe.Code == "" {
		return fault(CodePermanent, "", "the outside service reported that the call failed")
	}
	return pe
}

// wake makes the operation due at once and inserts the River job that
// carries it on, in tx.
func (e *Engine) wake(ctx context.Context, tx pgx.Tx, rec *store.Operation) error {
	if _, err := e.store.OperationWake(ctx, tx, rec.ID); err != nil {
		return fmt.Errorf("engine: wake %s: %w", rec.ID, err)
	}
	if err := e.enqueueResume(ctx, tx, resumeArgs{OperationID: rec.ID, Operation: rec.Name, Scope: rec.Scope}, time.Time{}); err != nil {
		return fmt.Errorf("engine: wake %s: enqueue: %w", rec.ID, err)
	}
	return nil
}
