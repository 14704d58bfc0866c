package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

// SignalTo names the operation a signal goes to: by OperationID, or by its
// client's Scope and Key. An OperationID with a Scope must be that client's
// operation.
type SignalTo struct {
	OperationID uuid.UUID
	Scope       string
	Key         string
}

// Signal sends sig to the operation to names, durably and once per sig.ID:
// in tx, the caller's, when it is not nil (the signal commits with the
// caller's writes), else in a transaction of its own. The operation keeps it
// whether or not a step waits for it yet; the SignalStep that waits for its
// name applies the first one kept, when it gets there. When such a step
// waits and no live run holds the operation, the operation is made due at
// once.
//
// It returns true when the signal is new, false when the operation keeps it
// already (a signal sent twice), and errors: ErrNotFound for no such
// operation (or another client's), ErrFinished for an operation that ended,
// a *ReusedError for an id kept with another name or payload, and
// ErrWaitOver when the deadline of the step that waits for it passed first
// (the step then times out, if it has not yet: the operation is made due,
// unless tx is the caller's: its timer does it) or another signal decided
// the step already.
func (e *Engine) Signal(ctx context.Context, tx pgx.Tx, to SignalTo, sig Signal) (bool, error) {
	switch {
	case sig.ID == "":
		return false, errors.New("engine: signal: an id is required")
	case sig.Name == "":
		return false, errors.New("engine: signal: a name is required")
	case strings.HasPrefix(sig.Name, "idemflow."):
		return false, fmt.Errorf("engine: signal: the name %q is the engine's own", sig.Name)
	case len(sig.Payload) > 0 && !json.Valid(sig.Payload):
		return false, errors.New("engine: signal: the payload is not JSON")
	case to.OperationID == uuid.Nil && (to.Scope == "" || to.Key == ""):
		return false, errors.New("engine: signal: an operation id, or a scope and a key, is required")
	}
	if tx != nil {
		added, _, err := e.signal(ctx, tx, to, sig)
		return added, err
	}
	var (
		added bool
		over  *store.Operation
	)
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var err error
		added, over, err = e.signal(ctx, tx, to, sig)
		return err
	})
	if over != nil {
		e.wakeOver(ctx, over)
	}
	return added, err
}

// signal keeps sig for its operation in tx. It returns the operation too
// when the wait for sig is over, to be made due apart from tx (which the
// refusal rolls back).
func (e *Engine) signal(ctx context.Context, tx pgx.Tx, to SignalTo, sig Signal) (bool, *store.Operation, error) {
	rec, err := e.lockOperation(ctx, tx, to)
	if err != nil {
		return false, nil, err
	}
	kept, err := e.store.SignalGet(ctx, tx, rec.ID, sig.ID)
	switch {
	case err == nil:
		var fields []string
		if kept.Name != sig.Name {
			fields = append(fields, "name")
		}
		if !jsonEqual(kept.Payload, sig.Payload) {
			fields = append(fields, "payload")
		}
		if len(fields) > 0 {
			return false, nil, &ReusedError{What: "signal", ID: sig.ID, Operation: rec.ID, Fields: fields}
		}
		return false, nil, nil
	case !errors.Is(err, store.ErrNotFound):
		return false, nil, fmt.Errorf("engine: signal: %w", err)
	}
	if rec.State != store.OperationInProgress {
		return false, nil, fmt.Errorf("engine: signal %s: %w", rec.ID, ErrFinished)
	}
	steps, err := e.store.WaitStepFor(ctx, tx, rec.ID, sig.Name)
	if err != nil {
		return false, nil, fmt.Errorf("engine: signal: %w", err)
	}
	waiting := false
	for _, s := range steps {
		switch {
		case s.Expired:
			return false, rec, fmt.Errorf("engine: signal %s to %s: %w: step %s's deadline (%s) passed first",
				sig.ID, rec.ID, ErrWaitOver, s.Name, s.Until.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
		case s.State == store.StepSucceeded || s.State == store.StepFailed || s.State == store.StepCompensated:
			// Another signal decided it: this one would never be applied.
			return false, nil, fmt.Errorf("engine: signal %s to %s: %w: step %s has applied a signal already",
				sig.ID, rec.ID, ErrWaitOver, s.Name)
		}
		waiting = waiting || s.State == store.StepWaiting
	}
	if _, err := e.store.SignalInsert(ctx, tx, store.Signal{OperationID: rec.ID, ID: sig.ID, Name: sig.Name, Payload: sig.Payload}); err != nil {
		return false, nil, fmt.Errorf("engine: signal: %w", err)
	}
	if waiting {
		if err := e.wakeWaiting(ctx, tx, rec); err != nil {
			return false, nil, err
		}
	}
	return true, nil, nil
}

// lockOperation reads the operation to names and locks its row until tx
// ends: a run's decision on a wait (which its fence's row lock begins) and
// a signal are thereby one after the other.
func (e *Engine) lockOperation(ctx context.Context, tx pgx.Tx, to SignalTo) (*store.Operation, error) {
	var (
		rec *store.Operation
		err error
	)
	if to.OperationID != uuid.Nil {
		rec, err = e.store.OperationGetForUpdate(ctx, tx, to.OperationID)
	} else {
		rec, err = e.store.OperationGetByKeyForUpdate(ctx, tx, to.Scope, to.Key)
	}
	if err != nil {
		return nil, mapNotFound(err)
	}
	if to.Scope != "" && rec.Scope != to.Scope || to.Key != "" && rec.Key != to.Key {
		return nil, ErrNotFound
	}
	return rec, nil
}

// wakeWaiting makes a waiting operation due at once, in tx, unless a live
// run holds it (which reads the signals when it decides). An engine with no
// River client (an Admin's) leaves the resume job to the sweepers, whose
// next sweep takes it.
func (e *Engine) wakeWaiting(ctx context.Context, tx pgx.Tx, rec *store.Operation) error {
	held, err := e.store.OperationHeld(ctx, tx, rec.ID)
	if err != nil {
		return fmt.Errorf("engine: wake %s: %w", rec.ID, err)
	}
	if held {
		return nil
	}
	if e.river == nil {
		if _, err := e.store.OperationWake(ctx, tx, rec.ID); err != nil {
			return fmt.Errorf("engine: wake %s: %w", rec.ID, err)
		}
		return nil
	}
	return e.wake(ctx, tx, rec)
}

// wakeOver makes an operation whose wait is over due at once, so that its
// deadline is carried out now if it was not yet. A failure is logged: the
// timer loops carry it out all the same.
func (e *Engine) wakeOver(ctx context.Context, rec *store.Operation) {
	err := pgx.BeginTxFunc(context.WithoutCancel(ctx), e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		return e.wakeWaiting(ctx, tx, rec)
	})
	if err != nil {
		e.logger.WarnContext(ctx, "could not make an operation whose wait is over due; its timer carries it out",
			slog.String("operation_id", rec.ID.String()), slog.Any("error", err))
	}
}
