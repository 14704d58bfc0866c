package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// Wait is what fixes the wait of a step that waits for a signal, a moment or
// approvals, when it is reached.
type Wait struct {
	OperationID uuid.UUID
	Step        string
	Position    int
	// Reason is "signal", "timer" or "approval"; Signal the signal it waits
	// for.
	Reason string
	Signal string
	// At, or else After past the moment the step is reached (by the
	// database's clock), is its deadline; neither: none.
	At    *time.Time
	After *time.Duration
	// Need is how many distinct approvals it needs.
	Need int
}

// Reached is a wait as fixed when its step was first reached.
type Reached struct {
	// Until is its deadline or moment (nil: none), Need the approvals it
	// needs, Since when it was reached.
	Until *time.Time
	Need  int
	Since time.Time
	// First is true when this call reached it.
	First bool
	// Now is the database's clock.
	Now time.Time
}

// WaitReach records that a run reached w's step, fixing its wait, and
// returns the wait as fixed (by this call or an earlier one). It returns
// ErrNotFound when the step is checkpointed already.
func (s *Store) WaitReach(ctx context.Context, db DBTX, w Wait) (*Reached, error) {
	var signal *string
	if w.Signal != "" {
		signal = &w.Signal
	}
	need := int32(w.Need)
	row, err := s.q.WaitReach(ctx, db, dbsqlc.WaitReachParams{
		OperationID: pguuid.UUID(w.OperationID), Name: w.Step, Position: int32(w.Position),
		WaitReason: &w.Reason, WaitSignal: signal, At: w.At, After: w.After, Need: &need,
	})
	if err != nil {
		return nil, mapErr("reach wait", err)
	}
	r := &Reached{Until: row.WaitUntil, First: row.ReachedNow, Now: row.Now}
	if row.WaitNeed != nil {
		r.Need = int(*row.WaitNeed)
	}
	if row.WaitingSince != nil {
		r.Since = *row.WaitingSince
	}
	return r, nil
}

// Signal is a signal to an operation, as kept.
type Signal struct {
	OperationID uuid.UUID
	ID          string
	Name        string
	Payload     json.RawMessage
	// Actor and Reason are an approval's or a rejection's.
	Actor      string
	Reason     string
	ReceivedAt time.Time
}

func signalFromRow(r *dbsqlc.IdemflowSignal) Signal {
	return Signal{OperationID: uuid.UUID(r.OperationID), ID: r.SignalID, Name: r.Name, Payload: r.Payload,
		Actor: r.Actor, Reason: r.Reason, ReceivedAt: r.ReceivedAt}
}

// SignalInsert keeps sig once per (operation, id). It returns false when
// the id is kept already (SignalGet reads it).
func (s *Store) SignalInsert(ctx context.Context, db DBTX, sig Signal) (bool, error) {
	_, err := s.q.SignalInsert(ctx, db, dbsqlc.SignalInsertParams{
		OperationID: pguuid.UUID(sig.OperationID), SignalID: sig.ID, Name: sig.Name, Payload: sig.Payload,
		Actor: sig.Actor, Reason: sig.Reason,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: keep signal: %w", err)
	}
	return true, nil
}

// SignalList lists the signals of the given names sent to operation id, in
// the order they were received.
func (s *Store) SignalList(ctx context.Context, db DBTX, id uuid.UUID, names []string) ([]Signal, error) {
	rows, err := s.q.SignalList(ctx, db, dbsqlc.SignalListParams{OperationID: pguuid.UUID(id), Names: names})
	if err != nil {
		return nil, fmt.Errorf("store: list signals: %w", err)
	}
	out := make([]Signal, len(rows))
	for i, r := range rows {
		out[i] = signalFromRow(r)
	}
	return out, nil
}

// WaitStep is a step of an operation that waits, or waited, for a signal.
type WaitStep struct {
	Name  string
	State StepState
	Until *time.Time
	Need  int
	// Expired is true once Until has passed by the database's clock.
	Expired bool
}

// WaitStepFor lists the steps of operation id that wait, or waited, for the
// signal named signal, in the order of the operation's steps.
func (s *Store) WaitStepFor(ctx context.Context, db DBTX, id uuid.UUID, signal string) ([]WaitStep, error) {
	rows, err := s.q.WaitStepFor(ctx, db, dbsqlc.WaitStepForParams{OperationID: pguuid.UUID(id), WaitSignal: &signal})
	if err != nil {
		return nil, fmt.Errorf("store: read waiting steps: %w", err)
	}
	out := make([]WaitStep, len(rows))
	for i, r := range rows {
		out[i] = WaitStep{Name: r.Name, State: StepState(r.State), Until: r.WaitUntil, Expired: r.Expired}
		if r.WaitNeed != nil {
			out[i].Need = int(*r.WaitNeed)
		}
	}
	return out, nil
}

// OperationReleaseWait hands back the operation that run holds while a step
// waits, due again at wakeAt (nil: only when woken). False: run no longer
// holds it.
func (s *Store) OperationReleaseWait(ctx context.Context, db DBTX, id, run uuid.UUID, wakeAt *time.Time, lease time.Duration) (bool, error) {
	_, err := s.q.OperationReleaseWait(ctx, db, dbsqlc.OperationReleaseWaitParams{
		ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), WakeAt: wakeAt, Lease: lease,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: release operation to wait: %w", err)
	}
	return true, nil
}

// OperationNextWake returns the earliest moment an operation of the
// definitions given that waits with no process busy on it is due (ok false:
// none), and the database's clock.
func (s *Store) OperationNextWake(ctx context.Context, db DBTX, definitions []string) (at time.Time, ok bool, now time.Time, err error) {
	row, err := s.q.OperationNextWake(ctx, db, definitions)
	if err != nil {
		return time.Time{}, false, time.Time{}, fmt.Errorf("store: next wake: %w", err)
	}
	return row.WakeAt, row.Found, row.Now, nil
}

// DueOperation is an operation whose wake_at has come.
type DueOperation struct {
	ID    uuid.UUID
	Name  string
	Scope string
}

// OperationListDue lists at most max operations of the definitions given
// whose wake_at has come, earliest first.
func (s *Store) OperationListDue(ctx context.Context, db DBTX, definitions []string, max int) ([]DueOperation, error) {
	rows, err := s.q.OperationListDue(ctx, db, dbsqlc.OperationListDueParams{Definitions: definitions, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("store: list due operations: %w", err)
	}
	out := make([]DueOperation, len(rows))
	for i, r := range rows {
		out[i] = DueOperation{ID: uuid.UUID(r.ID), Name: r.Name, Scope: r.Scope}
	}
	return out, nil
}

// OperationTakeDue takes an operation whose wake_at has come, for a resume
// job queued in the same transaction; false: another process took it.
func (s *Store) OperationTakeDue(ctx context.Context, db DBTX, id uuid.UUID, lease time.Duration) (bool, error) {
	n, err := s.q.OperationTakeDue(ctx, db, dbsqlc.OperationTakeDueParams{ID: pguuid.UUID(id), Lease: lease})
	if err != nil {
		return false, fmt.Errorf("store: take due operation: %w", err)
	}
	return n == 1, nil
}

// PendingApproval is an operation in progress whose step waits for
// approvals.
type PendingApproval struct {
	OperationID uuid.UUID
	Name        string
	Version     int
	Scope       string
	Key         string
	Step        string
	Since       time.Time
	Until       *time.Time
	Need        int
	ApprovedBy  []string
}

// ApprovalList lists at most max operations whose step waits for approvals,
// oldest first.
func (s *Store) ApprovalList(ctx context.Context, db DBTX, max int) ([]PendingApproval, error) {
	rows, err := s.q.ApprovalList(ctx, db, int32(max))
	if err != nil {
		return nil, fmt.Errorf("store: list approvals: %w", err)
	}
	out := make([]PendingApproval, len(rows))
	for i, r := range rows {
		a := PendingApproval{OperationID: uuid.UUID(r.ID), Name: r.Name, Version: int(r.Version), Scope: r.Scope, Key: r.Key,
			Step: r.Step, Until: r.WaitUntil, ApprovedBy: r.ApprovedBy}
		if r.WaitingSince != nil {
			a.Since = *r.WaitingSince
		}
		if r.WaitNeed != nil {
			a.Need = int(*r.WaitNeed)
		}
		out[i] = a
	}
	return out, nil
}

// OperationGetByKeyForUpdate reads the operation reserved under (scope, key)
// and locks its row until db's transaction ends.
func (s *Store) OperationGetByKeyForUpdate(ctx context.Context, db DBTX, scope, key string) (*Operation, error) {
	row, err := s.q.OperationGetByKeyForUpdate(ctx, db, dbsqlc.OperationGetByKeyForUpdateParams{Scope: scope, Key: key})
	if err != nil {
		return nil, mapErr("get operation by key", err)
	}
	return operationFromRow(row), nil
}

// SignalGet reads the signal id kept for operation op; ErrNotFound when
// there is none.
func (s *Store) SignalGet(ctx context.Context, db DBTX, op uuid.UUID, id string) (*Signal, error) {
	row, err := s.q.SignalGet(ctx, db, dbsqlc.SignalGetParams{OperationID: pguuid.UUID(op), SignalID: id})
	if err != nil {
		return nil, mapErr("read signal", err)
	}
	sig := signalFromRow(row)
	return &sig, nil
}
