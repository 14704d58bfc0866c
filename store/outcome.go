package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// Outcome is what an outside service said of the call made under a derived
// key, as the engine's inbox keeps it.
type Outcome struct {
	DerivedKey string
	// EventID names the message that carried it; the inbox keeps one outcome
	// per (DerivedKey, EventID).
	EventID string
	// Status is "succeeded", "failed" or "pending".
	Status    string
	Reference string
	Amount    int64
	// Data is what else the service told (an order id), as JSON; may be nil.
	Data json.RawMessage
	// Failure is the step's answer for a failed outcome, as JSON; may be nil.
	Failure    json.RawMessage
	ReceivedAt time.Time
}

// The errors of OutcomeRefuseNotMade.
var (
	// ErrOutcomeSucceeded: the inbox holds a success under the key.
	ErrOutcomeSucceeded = errors.New("store: the outside service reported the call as succeeded")
	// ErrMayLand: a request of the step may still land (SettleOpenError).
	ErrMayLand = errors.New("store: a request of the step may still land")
)

// SettleOpenError is ErrMayLand with the moment, by the database's clock,
// when no request of the step can land any more.
type SettleOpenError struct {
	Until time.Time
}

func (e *SettleOpenError) Error() string {
	return fmt.Sprintf("store: a request of the step may still land until %s", e.Until.UTC().Format(time.RFC3339Nano))
}

// Is reports whether target is ErrMayLand.
func (e *SettleOpenError) Is(target error) bool { return target == ErrMayLand }

// The SQLSTATEs that idemflow_refuse_not_made raises.
const (
	outcomeSucceededCode = "IF003"
	mayLandCode          = "IF004"
)

// OutcomeRecord keeps o in the inbox, in db's transaction, which it first
// serialises with every decision that the call under o.DerivedKey was not
// made (OutcomeRefuseNotMade). It returns true when o is new; else the
// outcome kept under the same event id before, unchanged.
func (s *Store) OutcomeRecord(ctx context.Context, db DBTX, o Outcome) (bool, *Outcome, error) {
	if err := s.q.OutcomeLock(ctx, db, o.DerivedKey); err != nil {
		return false, nil, fmt.Errorf("store: lock outcome key: %w", err)
	}
	_, err := s.q.OutcomeInsert(ctx, db, dbsqlc.OutcomeInsertParams{
		DerivedKey: o.DerivedKey, EventID: o.EventID, Status: o.Status, Reference: o.Reference, Amount: o.Amount,
		Data: nullJSON(o.Data), Failure: nullJSON(o.Failure),
	})
	if err == nil {
		return true, nil, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, nil, fmt.Errorf("store: record outcome: %w", err)
	}
	row, err := s.q.OutcomeGet(ctx, db, dbsqlc.OutcomeGetParams{DerivedKey: o.DerivedKey, EventID: o.EventID})
	if err != nil {
		return false, nil, mapErr("get outcome", err)
	}
	return false, outcomeFromRow(row), nil
}

// OutcomeListByKey lists what the inbox holds under key, oldest first.
func (s *Store) OutcomeListByKey(ctx context.Context, db DBTX, key string) ([]Outcome, error) {
	rows, err := s.q.OutcomeListByKey(ctx, db, key)
	if err != nil {
		return nil, fmt.Errorf("store: list outcomes: %w", err)
	}
	out := make([]Outcome, len(rows))
	for i, r := range rows {
		out[i] = *outcomeFromRow(r)
	}
	return out, nil
}

// OutcomeRefuseNotMade aborts db's transaction, with ErrOutcomeSucceeded,
// when the inbox holds a success under key, and, when bySilence (nothing was
// found, no answer came), with a *SettleOpenError while a request of the
// operation's step may still land by the stored moments and the database's
// clock. It is sent in the transaction that records that the call was not
// made, and holds the key's lock until it ends. With a Queue for db it only
// queues the statement, whose error the queue's sender returns (Err maps it).
func (s *Store) OutcomeRefuseNotMade(ctx context.Context, db DBTX, operationID uuid.UUID, step, key string, bySilence bool) error {
	err := s.q.OutcomeRefuseNotMade(ctx, db, dbsqlc.OutcomeRefuseNotMadeParams{
		OperationID: pguuid.UUID(operationID), Name: step, DerivedKey: key, BySilence: bySilence,
	})
	if err != nil {
		return fmt.Errorf("store: refuse not made: %w", Err(err))
	}
	return nil
}

// SettleTimes are the stored moments from which a request of a step can no
// longer land, and the database's clock when they were read.
type SettleTimes struct {
	// Until is when no request of the step can land any more; zero when no
	// request is known to have been sent.
	Until time.Time
	// Now is the database's clock.
	Now time.Time
	// Window is the operation's stored settle window (the one given to
	// OperationSettleBy when it stored none).
	Window time.Duration
}

// OperationSettleBy reads when a request of the operation's step can no
// longer land: the later of the step's settle_by and the operation's
// calls_until plus its settle_window. window is used for an operation that
// stored none (reserved by a binary from before it was stored).
func (s *Store) OperationSettleBy(ctx context.Context, db DBTX, operationID uuid.UUID, step string, window time.Duration) (SettleTimes, error) {
	row, err := s.q.OutcomeSettleBy(ctx, db, dbsqlc.OutcomeSettleByParams{OperationID: pguuid.UUID(operationID), Name: step})
	if err != nil {
		return SettleTimes{}, mapErr("read settle times", err)
	}
	t := SettleTimes{Now: row.Now, Window: window}
	if row.SettleWindow != nil {
		t.Window = *row.SettleWindow
	}
	if row.SettleBy != nil {
		t.Until = *row.SettleBy
	}
	if row.CallsUntil != nil {
		if end := row.CallsUntil.Add(t.Window); end.After(t.Until) {
			t.Until = end
		}
	}
	return t, nil
}

// OutcomeDeleteBefore deletes at most max outcomes that the inbox received
// before before, but those of a step that still waits for its outcome.
func (s *Store) OutcomeDeleteBefore(ctx context.Context, db DBTX, before time.Time, max int) (int, error) {
	n, err := s.q.OutcomeDeleteBefore(ctx, db, dbsqlc.OutcomeDeleteBeforeParams{Before: before, Max: int32(max)})
	if err != nil {
		return 0, fmt.Errorf("store: delete outcomes: %w", err)
	}
	return int(n), nil
}

func outcomeFromRow(r *dbsqlc.IdemflowOutcome) *Outcome {
	return &Outcome{
		DerivedKey: r.DerivedKey, EventID: r.EventID, Status: r.Status, Reference: r.Reference, Amount: r.Amount,
		Data: r.Data, Failure: r.Failure, ReceivedAt: r.ReceivedAt,
	}
}

// outcomeErr maps what idemflow_refuse_not_made raises, or nil.
func outcomeErr(pgErr *pgconn.PgError) error {
	switch pgErr.Code {
	case outcomeSucceededCode:
		return fmt.Errorf("%w: %w", ErrOutcomeSucceeded, pgErr)
	case mayLandCode:
		until, err := time.Parse(time.RFC3339Nano, pgErr.Detail)
		if err != nil {
			until = time.Time{}
		}
		return fmt.Errorf("%w: %w", &SettleOpenError{Until: until}, pgErr)
	}
	return nil
}
