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

// OperationInsertParams are the fields of a new operation.
type OperationInsertParams struct {
	ID   uuid.UUID
	Name string
	// Version is the version of the definition the operation starts on, from 1.
	Version     int
	Scope       string
	Key         string
	Steps       []string
	Input       json.RawMessage
	Fingerprint json.RawMessage
	// KeySecret is the operation's secret for its derived keys.
	KeySecret []byte
	// LockedBy is the run that will execute the operation at once, or nil when a
	// job will.
	LockedBy *uuid.UUID
	// Lease is how long the operation belongs to LockedBy (or to the job) before the
	// sweeper may take it over.
	Lease time.Duration
	// Now overrides the database clock, for tests. Nil means now().
	Now *time.Time
	// Checkpoints are steps that the reservation records as succeeded
	// (OperationReserve only): those of the transaction it commits with.
	Checkpoints []StepCheckpointParams
	// SettleWindow, when not nil, is the longest settle window of the
	// operation's external steps: a request that a run sends may land that
	// long after it (see OperationSettleBy).
	SettleWindow *time.Duration
}

// OperationInsert reserves (Scope, Key) for a new operation. It returns false, and
// writes nothing, when the key is already taken.
func (s *Store) OperationInsert(ctx context.Context, db DBTX, p OperationInsertParams) (bool, error) {
	_, err := s.q.OperationInsert(ctx, db, dbsqlc.OperationInsertParams{
		ID:           pguuid.UUID(p.ID),
		Name:         p.Name,
		Version:      int32(p.Version),
		Scope:        p.Scope,
		Key:          p.Key,
		Steps:        p.Steps,
		Input:        p.Input,
		Fingerprint:  nullJSON(p.Fingerprint),
		KeySecret:    p.KeySecret,
		LockedBy:     pguuid.Ptr(p.LockedBy),
		Lease:        p.Lease,
		Now:          p.Now,
		SettleWindow: p.SettleWindow,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store: insert operation: %w", err)
	}
	return true, nil
}

// OperationReserve reserves p.Scope and p.Key for an operation that p.LockedBy
// runs at once. Unlike OperationInsert it fails, with ErrKeyTaken, when the key
// is taken, which aborts the transaction: what is sent after it in the same
// batch does not run. With a Queue for db it only queues the statement.
func (s *Store) OperationReserve(ctx context.Context, db DBTX, p OperationInsertParams) error {
	err := s.q.OperationReserve(ctx, db, dbsqlc.OperationReserveParams{
		ID:           pguuid.UUID(p.ID),
		Name:         p.Name,
		Version:      int32(p.Version),
		Scope:        p.Scope,
		Key:          p.Key,
		Steps:        p.Steps,
		Input:        p.Input,
		Fingerprint:  nullJSON(p.Fingerprint),
		KeySecret:    p.KeySecret,
		LockedBy:     pguuid.Ptr(p.LockedBy),
		Lease:        p.Lease,
		Checkpoints:  encodeCheckpoints(p.Checkpoints, time.Now(), true),
		SettleWindow: p.SettleWindow,
	})
	if err != nil {
		return fmt.Errorf("store: reserve operation: %w", Err(err))
	}
	return nil
}

// OperationGetByKey reads the operation reserved under (scope, key).
func (s *Store) OperationGetByKey(ctx context.Context, db DBTX, scope, key string) (*Operation, error) {
	row, err := s.q.OperationGetByKey(ctx, db, dbsqlc.OperationGetByKeyParams{Scope: scope, Key: key})
	if err != nil {
		return nil, mapErr("get operation by key", err)
	}
	return operationFromRow(row), nil
}

// OperationGet reads an operation by its id.
func (s *Store) OperationGet(ctx context.Context, db DBTX, id uuid.UUID) (*Operation, error) {
	row, err := s.q.OperationGet(ctx, db, pguuid.UUID(id))
	if err != nil {
		return nil, mapErr("get operation", err)
	}
	return operationFromRow(row), nil
}

// OperationGiveBack hands back an operation that run claimed and did nothing
// with, left alone until lockedUntil (or now, if that has passed). It returns
// false when run no longer holds it.
func (s *Store) OperationGiveBack(ctx context.Context, db DBTX, id, run uuid.UUID, lockedUntil time.Time) (bool, error) {
	n, err := s.q.OperationGiveBack(ctx, db, dbsqlc.OperationGiveBackParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), LockedUntil: lockedUntil})
	if err != nil {
		return false, fmt.Errorf("store: give back operation: %w", err)
	}
	return n == 1, nil
}

// OperationGetForUpdate reads an operation and locks its row until db's
// transaction ends.
func (s *Store) OperationGetForUpdate(ctx context.Context, db DBTX, id uuid.UUID) (*Operation, error) {
	row, err := s.q.OperationGetForUpdate(ctx, db, pguuid.UUID(id))
	if err != nil {
		return nil, mapErr("get operation", err)
	}
	return operationFromRow(row), nil
}

// OperationClaim takes an operation in progress for run when nobody holds it (it
// waits for a job, or its holder's lease expired), and counts the run. A parked
// operation is taken only when parked is true. It returns ErrNotFound when the
// operation is finished, held by a live run, or parked (and parked is false).
func (s *Store) OperationClaim(ctx context.Context, db DBTX, id, run uuid.UUID, lease time.Duration, parked bool, versions []int32, settleWindow *time.Duration) (*Operation, error) {
	row, err := s.q.OperationClaim(ctx, db, dbsqlc.OperationClaimParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Lease: lease, Parked: parked,
		Versions: versions, SettleWindow: settleWindow})
	if err != nil {
		return nil, mapErr("claim operation", err)
	}
	return operationFromRow(row), nil
}

// OperationRenewLease extends run's hold on an operation. It returns false when run
// no longer holds it.
func (s *Store) OperationRenewLease(ctx context.Context, db DBTX, id, run uuid.UUID, lease time.Duration) (bool, error) {
	n, err := s.q.OperationRenewLease(ctx, db, dbsqlc.OperationRenewLeaseParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Lease: lease})
	if err != nil {
		return false, fmt.Errorf("store: renew lease: %w", err)
	}
	return n == 1, nil
}

// OperationRelease hands an operation from run to a job scheduled delay from
// now, by the database's clock, and returns when that is. The sweeper considers
// the operation again only a lease after it. It returns false when run no longer
// held the operation.
func (s *Store) OperationRelease(ctx context.Context, db DBTX, id, run uuid.UUID, delay, lease time.Duration, interrupted bool) (time.Time, bool, error) {
	runAt, err := s.q.OperationRelease(ctx, db, dbsqlc.OperationReleaseParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Delay: delay, Lease: lease, Interrupted: interrupted})
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("store: release operation: %w", err)
	}
	return runAt, true, nil
}

// OperationFence fails, with ErrFenced and the transaction aborted, unless run
// holds the operation, and keeps it so until the transaction ends (a claim by
// another run waits for it). With a Queue for db it only queues the statement.
func (s *Store) OperationFence(ctx context.Context, db DBTX, id, run uuid.UUID) error {
	if err := s.q.OperationFence(ctx, db, dbsqlc.OperationFenceParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run)}); err != nil {
		return fmt.Errorf("store: fence: %w", Err(err))
	}
	return nil
}

// OperationPark parks the operation that run holds, needing attention for the
// reason given: no run takes it up again until an operator retries or cancels it.
// It returns false when run no longer holds it.
func (s *Store) OperationPark(ctx context.Context, db DBTX, id, run uuid.UUID, code, reason string) (bool, error) {
	n, err := s.q.OperationPark(ctx, db, dbsqlc.OperationParkParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), AttentionCode: ptr(Text(code)), Attention: ptr(Text(reason))})
	if err != nil {
		return false, fmt.Errorf("store: park operation: %w", err)
	}
	return n == 1, nil
}

// OperationSetAttention marks the operation that run holds as needing an
// operator, for the reason given, while it goes on. It returns false when run no
// longer holds it.
func (s *Store) OperationSetAttention(ctx context.Context, db DBTX, id, run uuid.UUID, code, reason string) (bool, error) {
	n, err := s.q.OperationSetAttention(ctx, db, dbsqlc.OperationSetAttentionParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), AttentionCode: ptr(Text(code)), Attention: ptr(Text(reason))})
	if err != nil {
		return false, fmt.Errorf("store: set attention: %w", err)
	}
	return n == 1, nil
}

// ExpiredOperation names an operation in progress whose lease has expired.
type ExpiredOperation struct {
	ID      uuid.UUID
	Name    string
	Version int
	// Scope is set by OperationListExpired only.
	Scope string
}

// OperationListExpired lists up to max operations in progress of the
// definition (name, version) whose lease expired before now (nil: the
// database's clock), oldest lease first.
func (s *Store) OperationListExpired(ctx context.Context, db DBTX, name string, version, max int, now *time.Time) ([]ExpiredOperation, error) {
	rows, err := s.q.OperationListExpired(ctx, db, dbsqlc.OperationListExpiredParams{Name: name, Version: int32(version), Max: int32(max), Now: now})
	if err != nil {
		return nil, fmt.Errorf("store: list expired operations: %w", err)
	}
	out := make([]ExpiredOperation, len(rows))
	for i, r := range rows {
		out[i] = ExpiredOperation{ID: uuid.UUID(r.ID), Name: r.Name, Version: int(r.Version), Scope: r.Scope}
	}
	return out, nil
}

// OperationExtendExpired pushes an expired lease a lease forward, so that one sweep
// hands the operation to one job. It returns false when the lease was no longer
// expired (a run claimed the operation meanwhile).
func (s *Store) OperationExtendExpired(ctx context.Context, db DBTX, id uuid.UUID, lease time.Duration, now *time.Time) (bool, error) {
	n, err := s.q.OperationExtendExpired(ctx, db, dbsqlc.OperationExtendExpiredParams{ID: pguuid.UUID(id), Lease: lease, Now: now})
	if err != nil {
		return false, fmt.Errorf("store: extend expired lease: %w", err)
	}
	return n == 1, nil
}

func operationFromRow(r *dbsqlc.IdemflowOperation) *Operation {
	return &Operation{
		ID:            uuid.UUID(r.ID),
		Version:       int(r.Version),
		Name:          r.Name,
		Scope:         r.Scope,
		Key:           r.Key,
		State:         OperationState(r.State),
		Steps:         r.Steps,
		Input:         r.Input,
		Fingerprint:   r.Fingerprint,
		Result:        r.Result,
		Error:         r.Error,
		Runs:          int(r.Runs),
		LockedBy:      pguuid.FromPtr(r.LockedBy),
		LockedUntil:   r.LockedUntil,
		CreatedAt:     r.CreatedAt,
		FinishedAt:    r.FinishedAt,
		KeySecret:     r.KeySeed,
		PriorError:    r.PriorError,
		CallsUntil:    r.CallsUntil,
		AttentionCode: deref(r.AttentionCode),
		Attention:     deref(r.Attention),
		Parked:        r.Parked,
	}
}

// OperationSetError records the permanent error of an operation still in
// progress (it is compensating). It returns false when run no longer holds it.
func (s *Store) OperationSetError(ctx context.Context, db DBTX, id, run uuid.UUID, errJSON json.RawMessage) (bool, error) {
	n, err := s.q.OperationSetError(ctx, db, dbsqlc.OperationSetErrorParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Error: errJSON})
	if err != nil {
		return false, fmt.Errorf("store: set operation error: %w", err)
	}
	return n == 1, nil
}

// OperationWake makes an operation in progress, whose waiting step has
// something new to read, due at once for a resume job (unless a live run
// holds it). It returns false when the operation is not in progress.
func (s *Store) OperationWake(ctx context.Context, db DBTX, id uuid.UUID) (bool, error) {
	n, err := s.q.OperationWake(ctx, db, dbsqlc.OperationWakeParams{ID: pguuid.UUID(id)})
	if err != nil {
		return false, fmt.Errorf("store: wake operation: %w", err)
	}
	return n == 1, nil
}

// OperationHeld reports whether a live run holds operation id (its lease has
// not run out by the database's clock).
func (s *Store) OperationHeld(ctx context.Context, db DBTX, id uuid.UUID) (bool, error) {
	held, err := s.q.OperationHeld(ctx, db, dbsqlc.OperationHeldParams{ID: pguuid.UUID(id)})
	if err != nil {
		return false, mapErr("read operation lease", err)
	}
	return held, nil
}

// OperationUnpark unparks the operation that run holds and clears its
// attention; false when run no longer holds it.
func (s *Store) OperationUnpark(ctx context.Context, db DBTX, id, run uuid.UUID) (bool, error) {
	n, err := s.q.OperationUnpark(ctx, db, dbsqlc.OperationUnparkParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run)})
	if err != nil {
		return false, fmt.Errorf("store: unpark operation: %w", err)
	}
	return n == 1, nil
}

// OperationDeleteFinishedParams select finished operations to delete.
type OperationDeleteFinishedParams struct {
	// Expired selects the operations whose expiry (set when they finished)
	// has passed; Retention, Name and Exclude are then unused. Else the
	// operations without an expiry (finished before store migration 00009)
	// are selected by Retention, Name and Exclude.
	Expired bool
	// Retention: operations that finished longer ago than it are deleted.
	Retention time.Duration
	// Now overrides the database's clock, for tests. Nil means now().
	Now *time.Time
	// Name, when not empty, limits the deletion to one operation type.
	Name string
	// Exclude are operation types left alone (those with a retention of their own).
	Exclude []string
	// Max bounds the rows deleted.
	Max int
	// Timeout bounds the statement; zero means no bound.
	Timeout time.Duration
}

// OperationDeleteFinished deletes up to p.Max finished operations, with their
// steps, in one short transaction, and returns how many it deleted. Operations in
// progress are never deleted.
func (s *Store) OperationDeleteFinished(ctx context.Context, db Beginner, p OperationDeleteFinishedParams) (int, error) {
	var name *string
	if p.Name != "" {
		name = &p.Name
	}
	exclude := p.Exclude
	if exclude == nil {
		exclude = []string{}
	}
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if p.Timeout > 0 {
			if err := s.q.SetLocalStatementTimeout(ctx, tx, p.Timeout.Milliseconds()); err != nil {
				return err
			}
		}
		var err error
		if p.Expired {
			n, err = s.q.OperationDeleteExpired(ctx, tx, dbsqlc.OperationDeleteExpiredParams{Now: p.Now, Max: int32(p.Max)})
			return err
		}
		n, err = s.q.OperationDeleteFinished(ctx, tx, dbsqlc.OperationDeleteFinishedParams{
			Now: p.Now, Retention: p.Retention, Name: name, Exclude: exclude, Max: int32(p.Max),
		})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("store: delete finished operations: %w", err)
	}
	return int(n), nil
}

// Beginner starts transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// OperationReopen gives a failed or parked operation back to the runs: in
// progress again, its answer and attention cleared, waiting for a job, and its
// succeeded steps' compensations given their attempts again. Going forward
// (compensating false), its error is cleared and its unsucceeded steps are
// forgotten so that they run again; compensating, a parked operation keeps
// its error and its failed and compensated steps, so that its next run goes
// on undoing the rest. With keepAnswer, a failed operation's error is kept as
// its PriorError until it finishes again. It returns false when the operation is neither failed
// nor parked.
func (s *Store) OperationReopen(ctx context.Context, db DBTX, id uuid.UUID, lease time.Duration, compensating, keepAnswer bool) (bool, error) {
	n, err := s.q.OperationReopen(ctx, db, dbsqlc.OperationReopenParams{ID: pguuid.UUID(id), Lease: lease, KeepError: compensating, KeepAnswer: keepAnswer})
	if err != nil {
		return false, fmt.Errorf("store: reopen operation: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if !compensating {
		if err := s.q.StepDeleteUnsucceeded(ctx, db, pguuid.UUID(id)); err != nil {
			return false, fmt.Errorf("store: reopen operation: %w", err)
		}
	}
	if err := s.q.StepResetSucceeded(ctx, db, pguuid.UUID(id)); err != nil {
		return false, fmt.Errorf("store: reopen operation: %w", err)
	}
	return true, nil
}

// OperationFilter selects operations for OperationList; zero fields select
// all.
type OperationFilter struct {
	State OperationState
	Name  string
	Scope string
	// CreatedBefore, when set, keeps operations created before it.
	CreatedBefore *time.Time
	// NeedsAttention keeps operations that need attention (engine.Info.NeedsAttention).
	NeedsAttention bool
	// After, when set, pages on after this operation (newest first).
	After *OperationCursor
	Max   int
}

// OperationCursor is where a page of OperationList ended.
type OperationCursor struct {
	CreatedAt time.Time
	ID        uuid.UUID
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// OperationList lists the operations that f selects, newest first, at most f.Max.
func (s *Store) OperationList(ctx context.Context, db DBTX, f OperationFilter) ([]*Operation, error) {
	p := dbsqlc.OperationListParams{
		State: nonEmpty(string(f.State)), Name: nonEmpty(f.Name), Scope: nonEmpty(f.Scope),
		CreatedBefore: f.CreatedBefore, NeedsAttention: f.NeedsAttention, Max: int32(f.Max),
	}
	if f.After != nil {
		p.AfterCreated, p.AfterID = &f.After.CreatedAt, pguuid.Ptr(&f.After.ID)
	}
	rows, err := s.q.OperationList(ctx, db, p)
	if err != nil {
		return nil, fmt.Errorf("store: list operations: %w", err)
	}
	out := make([]*Operation, len(rows))
	for i, r := range rows {
		out[i] = operationFromRow(&r.IdemflowOperation)
		out[i].Mismatched, out[i].VersionWaiting = r.Mismatched, r.VersionWaiting
	}
	return out, nil
}

// UnfinishedOperation is an unfinished operation as the pre-deploy check sees
// it.
type UnfinishedOperation struct {
	ID      uuid.UUID
	Name    string
	Version int
	// Steps is the step list it started with.
	Steps []string
	// Failing is true while it compensates.
	Failing bool
	// Succeeded and Compensated are its steps in those states.
	Succeeded   []string
	Compensated []string
}

// OperationListUnfinished reads every unfinished operation with what the
// pre-deploy check needs, oldest first. It reads them all: not for the request
// path.
func (s *Store) OperationListUnfinished(ctx context.Context, db DBTX) ([]UnfinishedOperation, error) {
	rows, err := s.q.OperationListUnfinishedForCheck(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("store: list unfinished operations: %w", err)
	}
	out := make([]UnfinishedOperation, len(rows))
	for i, r := range rows {
		out[i] = UnfinishedOperation{
			ID: uuid.UUID(r.ID), Name: r.Name, Version: int(r.Version), Steps: r.Steps,
			Failing: r.Failing, Succeeded: r.Succeeded, Compensated: r.Compensated,
		}
	}
	return out, nil
}

// OperationListOtherVersions lists up to max operations in progress of name,
// of none of versions, whose lease expired: the ones a process that runs
// versions leaves alone. It returns their ids and versions.
func (s *Store) OperationListOtherVersions(ctx context.Context, db DBTX, name string, versions []int32, max int) ([]ExpiredOperation, error) {
	rows, err := s.q.OperationListOtherVersions(ctx, db, dbsqlc.OperationListOtherVersionsParams{Name: name, Versions: versions, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("store: list operations of other versions: %w", err)
	}
	out := make([]ExpiredOperation, len(rows))
	for i, r := range rows {
		out[i] = ExpiredOperation{ID: uuid.UUID(r.ID), Name: name, Version: int(r.Version)}
	}
	return out, nil
}

// InProgressStat is, for one operation type, how many operations are in
// progress and how old the oldest is.
type InProgressStat struct {
	Name       string
	Version    int
	InProgress int64
	// NeedingAttention counts those that wait for an operator;
	// WaitingOutcome those with a step that waits for its outcome,
	// WaitingSignal, WaitingTimer and WaitingApproval those with a step that
	// waits for a signal, a moment or approvals.
	NeedingAttention int64
	WaitingOutcome   int64
	WaitingSignal    int64
	WaitingTimer     int64
	WaitingApproval  int64
	Oldest           time.Duration
}

// OperationInProgressStats reads InProgressStat for every operation type with
// operations in progress, in one index-only scan.
func (s *Store) OperationInProgressStats(ctx context.Context, db DBTX) ([]InProgressStat, error) {
	rows, err := s.q.OperationInProgressStats(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("store: operations in progress: %w", err)
	}
	out := make([]InProgressStat, len(rows))
	for i, r := range rows {
		out[i] = InProgressStat{Name: r.Name, Version: int(r.Version), InProgress: r.InProgress, NeedingAttention: r.NeedingAttention,
			WaitingOutcome: r.WaitingOutcome, WaitingSignal: r.WaitingSignal, WaitingTimer: r.WaitingTimer, WaitingApproval: r.WaitingApproval, Oldest: time.Duration(r.OldestSeconds * float64(time.Second))}
	}
	return out, nil
}

// OrphanedOperation is an operation whose lease a run of a dead process holds.
type OrphanedOperation struct {
	ID    uuid.UUID
	Name  string
	Scope string
	// RunID is the dead run's.
	RunID uuid.UUID
}

// OperationListOrphaned lists at most max operations of definitions ("name@version")
// whose lease a run of a dead process holds: one whose id starts with a key of
// namespace that no session of the database holds as an advisory lock.
func (s *Store) OperationListOrphaned(ctx context.Context, db DBTX, namespace int64, definitions []string, max int) ([]OrphanedOperation, error) {
	rows, err := s.q.OperationListOrphaned(ctx, db, dbsqlc.OperationListOrphanedParams{Namespace: namespace, Definitions: definitions, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("store: list orphaned operations: %w", err)
	}
	out := make([]OrphanedOperation, len(rows))
	for i, r := range rows {
		out[i] = OrphanedOperation{ID: uuid.UUID(r.ID), Name: r.Name, Scope: r.Scope, RunID: uuid.UUID(r.RunID)}
	}
	return out, nil
}

// OperationTakeOver takes operation id from the dead run run, with a lease for
// the resume job queued in the same transaction; false when that run no
// longer holds it.
func (s *Store) OperationTakeOver(ctx context.Context, db DBTX, id, run uuid.UUID, lease time.Duration) (bool, error) {
	r := pguuid.UUID(run)
	n, err := s.q.OperationTakeOver(ctx, db, dbsqlc.OperationTakeOverParams{ID: pguuid.UUID(id), RunID: &r, Lease: lease})
	if err != nil {
		return false, fmt.Errorf("store: take over operation: %w", err)
	}
	return n == 1, nil
}
