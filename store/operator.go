package store

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// Process is a process that runs an engine with workers.
type Process struct {
	ID   uuid.UUID
	Host string
	PID  int
	// Definitions are the ones it runs, as "name@version".
	Definitions []string
	Lease       time.Duration
	StartedAt   time.Time
	SeenAt      time.Time
}

// ProcessUpsert records p, or refreshes its seen_at.
func (s *Store) ProcessUpsert(ctx context.Context, db DBTX, p Process) error {
	err := s.q.ProcessUpsert(ctx, db, dbsqlc.ProcessUpsertParams{
		ID: pguuid.UUID(p.ID), Host: p.Host, Pid: int32(p.PID), Definitions: p.Definitions, Lease: p.Lease,
	})
	if err != nil {
		return fmt.Errorf("store: record process: %w", err)
	}
	return nil
}

// ProcessDelete forgets the process id.
func (s *Store) ProcessDelete(ctx context.Context, db DBTX, id uuid.UUID) error {
	if err := s.q.ProcessDelete(ctx, db, pguuid.UUID(id)); err != nil {
		return fmt.Errorf("store: forget process: %w", err)
	}
	return nil
}

// ProcessListLive lists the processes seen within three of their leases, and
// forgets the others.
func (s *Store) ProcessListLive(ctx context.Context, db DBTX) ([]Process, error) {
	rows, err := s.q.ProcessListLive(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("store: list processes: %w", err)
	}
	out := make([]Process, len(rows))
	for i, r := range rows {
		out[i] = Process{ID: uuid.UUID(r.ID), Host: r.Host, PID: int(r.Pid), Definitions: r.Definitions,
			Lease: r.Lease, StartedAt: r.StartedAt, SeenAt: r.SeenAt}
	}
	return out, nil
}

// OperatorRequest is an operator's request to retry or cancel an operation.
type OperatorRequest struct {
	ID          int64
	OperationID uuid.UUID
	// Action is "retry" or "cancel".
	Action      string
	Reason      string
	RequestedAt time.Time
	// Force marks a retry that reopens an operation failed by a server fault.
	Force bool
	// Actor is who asked; Made and Reference are a resolve's word (Made nil
	// for another action).
	Actor     string
	Made      *bool
	Reference string
	// Outcome is "done", "refused" or "failed" once DoneAt is set; Message
	// says what happened, and Code why a refused one was refused.
	DoneAt  *time.Time
	Outcome string
	Message string
	Code    string
}

// OperatorRequestInsert records a request and returns its id.
func (s *Store) OperatorRequestInsert(ctx context.Context, db DBTX, r OperatorRequest) (int64, error) {
	id, err := s.q.OperatorRequestInsert(ctx, db, dbsqlc.OperatorRequestInsertParams{
		OperationID: pguuid.UUID(r.OperationID), Action: r.Action, Reason: Text(r.Reason), Force: r.Force,
		Actor: Text(r.Actor), Made: r.Made, Reference: nonEmpty(Text(r.Reference)),
	})
	if err != nil {
		return 0, fmt.Errorf("store: record operator request: %w", err)
	}
	return id, nil
}

// OperatorRequestGet reads request id.
func (s *Store) OperatorRequestGet(ctx context.Context, db DBTX, id int64) (*OperatorRequest, error) {
	r, err := s.q.OperatorRequestGet(ctx, db, id)
	if err != nil {
		return nil, mapErr("get operator request", err)
	}
	out := &OperatorRequest{ID: r.ID, OperationID: uuid.UUID(r.OperationID), Action: r.Action, Reason: r.Reason,
		RequestedAt: r.RequestedAt, DoneAt: r.DoneAt, Force: r.Force, Actor: r.Actor, Made: r.Made, Reference: deref(r.Reference)}
	if r.Outcome != nil {
		out.Outcome = *r.Outcome
	}
	if r.Message != nil {
		out.Message = *r.Message
	}
	out.Code = deref(r.Code)
	return out, nil
}

// OperatorRequestTake takes up to max pending requests for operations of
// definitions ("name@version") for the process takenBy.
func (s *Store) OperatorRequestTake(ctx context.Context, db DBTX, takenBy uuid.UUID, definitions []string, lease time.Duration, max int) ([]OperatorRequest, error) {
	rows, err := s.q.OperatorRequestTake(ctx, db, dbsqlc.OperatorRequestTakeParams{
		TakenBy: pguuid.Ptr(&takenBy), Lease: lease, Definitions: definitions, Max: int32(max),
	})
	if err != nil {
		return nil, fmt.Errorf("store: take operator requests: %w", err)
	}
	out := make([]OperatorRequest, len(rows))
	for i, r := range rows {
		out[i] = OperatorRequest{ID: r.ID, OperationID: uuid.UUID(r.OperationID), Action: r.Action, Reason: r.Reason, Force: r.Force,
			Actor: r.Actor, Made: r.Made, Reference: deref(r.Reference)}
	}
	return out, nil
}

// OperatorRequestRenew keeps the requests ids that takenBy took, and has not
// finished, taken.
func (s *Store) OperatorRequestRenew(ctx context.Context, db DBTX, ids []int64, takenBy uuid.UUID) error {
	if err := s.q.OperatorRequestRenew(ctx, db, dbsqlc.OperatorRequestRenewParams{Ids: ids, TakenBy: pguuid.Ptr(&takenBy)}); err != nil {
		return fmt.Errorf("store: renew operator request: %w", err)
	}
	return nil
}

// OperatorRequestFinish records what became of request id.
func (s *Store) OperatorRequestFinish(ctx context.Context, db DBTX, id int64, takenBy uuid.UUID, outcome, message, code string) error {
	err := s.q.OperatorRequestFinish(ctx, db, dbsqlc.OperatorRequestFinishParams{
		ID: id, TakenBy: pguuid.Ptr(&takenBy), Outcome: &outcome, Message: &message, Code: nonEmpty(code),
	})
	if err != nil {
		return fmt.Errorf("store: finish operator request: %w", err)
	}
	return nil
}

// OperatorRequestFailUnknown ends the pending requests for operations that do
// not exist, and returns how many.
func (s *Store) OperatorRequestFailUnknown(ctx context.Context, db DBTX) (int64, error) {
	n, err := s.q.OperatorRequestFailUnknown(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("store: end requests for unknown operations: %w", err)
	}
	return n, nil
}

// OperatorRequestRecord records a request carried out at once, with its
// outcome ("done", "refused" or "failed") and message: an entry of the
// operation's audit trail.
func (s *Store) OperatorRequestRecord(ctx context.Context, db DBTX, r OperatorRequest) error {
	err := s.q.OperatorRequestRecord(ctx, db, dbsqlc.OperatorRequestRecordParams{
		OperationID: pguuid.UUID(r.OperationID), Action: r.Action, Reason: Text(r.Reason), Force: r.Force,
		Actor: Text(r.Actor), Made: r.Made, Reference: nonEmpty(Text(r.Reference)),
		Outcome: ptr(r.Outcome), Message: ptr(Text(r.Message)), Code: nonEmpty(r.Code),
	})
	if err != nil {
		return fmt.Errorf("store: record operator request: %w", err)
	}
	return nil
}

// OperatorRequestListByOperation reads the operation's operator requests,
// oldest first: its audit trail.
func (s *Store) OperatorRequestListByOperation(ctx context.Context, db DBTX, operationID uuid.UUID) ([]OperatorRequest, error) {
	rows, err := s.q.OperatorRequestListByOperation(ctx, db, pguuid.UUID(operationID))
	if err != nil {
		return nil, fmt.Errorf("store: list operator requests: %w", err)
	}
	out := make([]OperatorRequest, len(rows))
	for i, r := range rows {
		out[i] = OperatorRequest{ID: r.ID, OperationID: operationID, Action: r.Action, Reason: r.Reason, Actor: r.Actor,
			Force: r.Force, Made: r.Made, Reference: deref(r.Reference), RequestedAt: r.RequestedAt, DoneAt: r.DoneAt,
			Outcome: deref(r.Outcome), Message: deref(r.Message), Code: deref(r.Code)}
	}
	return out, nil
}
