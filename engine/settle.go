package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// SettleSucceeded delivers the final outcome of an external step that waits
// for it (StepStatusWaiting): its call went through. fill records the outcome
// in the operation's state, as the step would have (the provider's id of what
// it made, say); nil leaves the state as it is. The step succeeds, resolved
// by ResolvedByEvent, and the operation goes forward in a River job that
// starts at once. It runs in tx, the caller's transaction (a webhook
// handler's, which records the event in the same commit), and takes effect
// when tx commits.
//
// It returns ErrRunning, changing nothing, while a live run holds the
// operation (its lookup may be deciding): try again shortly. It returns false,
// changing nothing, when the step does not wait (or no step waits under
// ref.DerivedKey): it was
// settled already (an event delivered twice, or the step's lookup was first),
// or it has not begun waiting (its call is still being made, and its own answer
// or lookup will tell), or the operation has finished. ErrNotFound when there
// is no operation ref.OperationID; an error when id is an operation of another type, step
// is not one of its external steps, or fill fails (nothing is settled then).
func (op *Operation[In, S, Out]) SettleSucceeded(ctx context.Context, tx pgx.Tx, e *Engine, ref StepRef,
	fill func(in In, state *S) error) (bool, error) {
	rec, st, recorded, err := e.waitingStep(ctx, tx, op.name, ref)
	if err != nil || st == nil {
		return false, err
	}
	id, step := rec.ID, st.name
	inAny, stateAny, err := settleValues(op.definition(), rec, recorded)
	if err != nil {
		return false, fmt.Errorf("engine: settle %s step %s: %w", id, step, err)
	}
	if fill != nil {
		if err := protect(func() error { return fill(inAny.(In), stateAny.(*S)) }); err != nil {
			return false, fmt.Errorf("engine: settle %s step %s: %w", id, step, err)
		}
	}
	output, err := json.Marshal(stateAny)
	if err != nil {
		return false, fmt.Errorf("engine: settle %s step %s: encode state: %w", id, step, err)
	}
	ok, err := e.store.StepSettle(ctx, tx, store.StepSettleParams{
		OperationID: id, Name: step, State: store.StepSucceeded, Output: output, ResolvedBy: string(ResolvedByEvent),
	})
	if err != nil || !ok {
		return false, wrapSettle(err)
	}
	if err := e.wake(ctx, tx, rec, nil); err != nil {
		return false, err
	}
	e.logger.InfoContext(ctx, "waiting step settled by an event: succeeded",
		slog.String("operation_id", id.String()), slog.String("operation", rec.Name), slog.String("step", step))
	return true, nil
}

// SettleFailed delivers the final outcome of an external step that waits for
// it (StepStatusWaiting): its call ended without effect (a pending refund that
// the provider failed), with failure as the step's answer (a business answer,
// made with Fail). The step fails, and the operation compensates what it did
// and ends failed with failure, in a River job that starts at once (past its
// point of no return it is parked instead, as for any failure there). check,
// when not nil, is asked first whether the outcome is the step's (the event
// names the order and amount asked): its error settles nothing and is
// returned. It runs in tx, as SettleSucceeded does, and returns what it
// returns.
func (op *Operation[In, S, Out]) SettleFailed(ctx context.Context, tx pgx.Tx, e *Engine, ref StepRef,
	failure *PermanentError, check func(in In, state *S) error) (bool, error) {
	if failure == nil {
		return false, errors.New("engine: settle failed: no failure given")
	}
	rec, st, recorded, err := e.waitingStep(ctx, tx, op.name, ref)
	if err != nil || st == nil {
		return false, err
	}
	id, step := rec.ID, st.name
	if check != nil {
		inAny, stateAny, err := settleValues(op.definition(), rec, recorded)
		if err != nil {
			return false, fmt.Errorf("engine: settle %s step %s: %w", id, step, err)
		}
		if err := protect(func() error { return check(inAny.(In), stateAny.(*S)) }); err != nil {
			return false, fmt.Errorf("engine: settle %s step %s: %w", id, step, err)
		}
	}
	pe := &PermanentError{Code: failure.Code, Message: failure.Message, Cause: failure.Cause, Details: failure.Details,
		Step: step, Fault: failure.ServerFault()}
	ok, err := e.store.StepSettle(ctx, tx, store.StepSettleParams{
		OperationID: id, Name: step, State: store.StepFailed, LastError: pe.Message, LastCause: pe.Error(),
	})
	if err != nil || !ok {
		return false, wrapSettle(err)
	}
	raw, err := json.Marshal(pe.stored())
	if err != nil {
		return false, fmt.Errorf("engine: settle %s step %s: encode error: %w", id, step, err)
	}
	if err := e.wake(ctx, tx, rec, raw); err != nil {
		return false, err
	}
	e.logger.InfoContext(ctx, "waiting step settled by an event: failed; the operation compensates",
		slog.String("operation_id", id.String()), slog.String("operation", rec.Name), slog.String("step", step),
		slog.String("code", pe.Code))
	return true, nil
}

// settleValues decodes the operation's input and its state after its last
// succeeded step.
func settleValues(def *opDef, rec *store.Operation, recorded []store.Step) (in, state any, err error) {
	var raw []byte
	last := -1
	for _, s := range recorded {
		if (s.State == store.StepSucceeded || s.State == store.StepCompensated) && s.Position > last {
			last, raw = s.Position, s.Output
		}
	}
	if in, err = def.decodeInput(rec.Input); err != nil {
		return nil, nil, err
	}
	if state, err = def.decodeState(raw); err != nil {
		return nil, nil, err
	}
	return in, state, nil
}

// StepRef names a step of an operation: by OperationID and Step, or, for a
// step that waits for its outcome, by its DerivedKey alone (what an outside
// service's event names).
type StepRef struct {
	OperationID uuid.UUID
	Step        string
	DerivedKey  string
}

// waitingStep locks the operation of ref in tx and returns it, its external
// step of ref when that step waits for its outcome (nil when it does not, or
// the operation has finished), and its recorded steps. name, when not empty,
// is the operation type the caller expects.
func (e *Engine) waitingStep(ctx context.Context, tx pgx.Tx, name string, ref StepRef) (*store.Operation, *stepDef, []store.Step, error) {
	if tx == nil {
		return nil, nil, nil, errors.New("engine: settle: no transaction given")
	}
	id, step := ref.OperationID, ref.Step
	if ref.DerivedKey != "" {
		var err error
		id, step, err = e.store.StepWaitingByKey(ctx, tx, ref.DerivedKey)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil, nil, nil
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("engine: settle: %w", err)
		}
	}
	rec, err := e.store.OperationGetForUpdate(ctx, tx, id)
	if err != nil {
		return nil, nil, nil, mapNotFound(err)
	}
	if name != "" && rec.Name != name {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: it is an operation of type %q, not %q", id, rec.Name, name)
	}
	def := e.def(rec.Name, rec.Version)
	if def == nil {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: %w: %q version %d", id, ErrNotRegistered, rec.Name, rec.Version)
	}
	i, ok := def.index[step]
	if !ok || def.steps[i].kind != StepKindExternal {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: %q is not an external step of %s", id, step, rec.Name)
	}
	if rec.State != store.OperationInProgress {
		return rec, nil, nil, nil
	}
	// A live run may be asking the step's lookup, or deciding on it: it
	// would not see this outcome and could act against it. The caller tries
	// again (a webhook's step is retried), or the run's own lookup tells.
	held, err := e.store.OperationHeld(ctx, tx, id)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: %w", id, err)
	}
	if held {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: %w: a live run holds it; try again shortly", id, ErrRunning)
	}
	recorded, err := e.store.StepListByOperation(ctx, tx, id)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("engine: settle %s: %w", id, err)
	}
	for _, s := range recorded {
		if s.Name == step && s.State == store.StepWaiting {
			return rec, def.steps[i], recorded, nil
		}
	}
	return rec, nil, nil, nil
}

// wake makes the operation due at once and inserts the River job that
// carries it on, in tx; errJSON, when not nil, is recorded as its error.
func (e *Engine) wake(ctx context.Context, tx pgx.Tx, rec *store.Operation, errJSON json.RawMessage) error {
	if _, err := e.store.OperationWake(ctx, tx, rec.ID, errJSON); err != nil {
		return fmt.Errorf("engine: settle %s: %w", rec.ID, err)
	}
	if _, err := e.river.InsertTx(ctx, tx, resumeArgs{OperationID: rec.ID, Operation: rec.Name}, &river.InsertOpts{Queue: e.cfg.Queue}); err != nil {
		return fmt.Errorf("engine: settle %s: enqueue: %w", rec.ID, err)
	}
	return nil
}

func wrapSettle(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("engine: %w", err)
}
