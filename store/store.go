package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/store/internal/dbsqlc"
)

// ErrNotFound is returned when a row that was asked for does not exist.
var ErrNotFound = errors.New("store: not found")

// Errors that the engine's statements raise on purpose, so that a statement
// sent after them in the same batch (COMMIT, a step's first statement) does
// not run.
var (
	// ErrKeyTaken: OperationReserve found the key reserved already.
	ErrKeyTaken = errors.New("store: idempotency key already taken")
	// ErrFenced: a checkpoint found that another run recorded the step first, or
	// holds the operation.
	ErrFenced = errors.New("store: another run holds the operation")
)

// SQLSTATEs that Err tells apart.
const (
	// fencedCode is what idemflow_fence raises.
	fencedCode = "IF001"
	// uniqueViolation is PostgreSQL's unique_violation.
	uniqueViolation = "23505"
)

// Err returns err wrapped with ErrKeyTaken or ErrFenced when it is the error
// that OperationReserve or StepCheckpointMany raise on purpose, and err itself
// otherwise. It is for errors read back from a batch of queued statements.
func Err(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == fencedCode:
		return fmt.Errorf("%w: %w", ErrFenced, err)
	case pgErr.Code == uniqueViolation && pgErr.ConstraintName == "idemflow_operation_scope_key":
		return fmt.Errorf("%w: %w", ErrKeyTaken, err)
	case pgErr.Code == uniqueViolation && pgErr.ConstraintName == "idemflow_step_pkey":
		// A checkpoint's INSERT met the row of a step that another run recorded.
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return err
}

// Queue is a DBTX that queues the statements of the store's exec-only methods
// (OperationReserve, StepCheckpointMany) into Batch instead of sending them;
// their errors come back with the batch's results. Reads fail.
type Queue struct {
	Batch *pgx.Batch
}

var errQueueRead = errors.New("store: a Queue queues statements; it cannot answer a read")

// Exec queues sql with args.
func (q Queue) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.Batch.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// Query fails: a queued statement has no rows yet.
func (q Queue) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errQueueRead
}

// QueryRow fails: a queued statement has no row yet.
func (q Queue) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errQueueRead }

// DBTX is what every Store method runs on: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// OperationState is the state of an operation.
type OperationState string

// The states of an operation.
const (
	OperationInProgress OperationState = "in_progress"
	OperationSucceeded  OperationState = "succeeded"
	OperationFailed     OperationState = "failed"
)

// StepState is the recorded state of a step. A step with no record is pending.
type StepState string

// The recorded states of a step.
const (
	// StepRetrying: an attempt failed and another will follow.
	StepRetrying StepState = "retrying"
	// StepSucceeded: the step is checkpointed and never runs again.
	StepSucceeded StepState = "succeeded"
	// StepFailed: the step failed for good and ended its operation.
	StepFailed StepState = "failed"
	// StepCompensated: the step had succeeded, and its compensation has run.
	StepCompensated StepState = "compensated"
)

// Operation is a row of idemflow_operation.
type Operation struct {
	ID    uuid.UUID
	Name  string
	Scope string
	Key   string
	State OperationState
	// Steps is the step list the operation was started with.
	Steps       []string
	Input       json.RawMessage
	Fingerprint json.RawMessage
	// Result holds the exact bytes of the final result once the operation succeeded.
	Result json.RawMessage
	// Error holds the permanent error once the operation failed.
	Error json.RawMessage
	// Runs counts the runs that claimed the operation: the first attempt and every resume.
	Runs int
	// LockedBy is the run that holds the operation, nil while it waits for a job.
	LockedBy    *uuid.UUID
	LockedUntil time.Time
	CreatedAt   time.Time
	FinishedAt  *time.Time
	// KeySecret, chosen at random at reservation, is what the derived keys of the
	// operation's external steps come from; nil for operations reserved before
	// it existed.
	KeySecret []byte
	// AttentionCode and Attention say why the operation waits for an operator;
	// empty when it does not.
	AttentionCode string
	Attention     string
	// Parked is true while no run may take the operation up again but an
	// operator's retry or cancel.
	Parked bool
}

// Step is a row of idemflow_step.
type Step struct {
	OperationID uuid.UUID
	Name        string
	Position    int
	State       StepState
	Attempts    int
	// Output is the operation's state after the step succeeded.
	Output json.RawMessage
	// LastError is the last failure's message for clients, LastCause the same
	// failure for operators.
	LastError string
	LastCause string
	// ResolvedBy is "call" or "lookup" for an external step that succeeded.
	ResolvedBy string
	// Compensations counts the failed attempts of the step's compensation.
	Compensations int
	StartedAt     time.Time
	FinishedAt    *time.Time
}

// Store runs idemflow's queries. The zero value is not usable: call New.
type Store struct {
	q *dbsqlc.Queries
}

// New returns a Store.
func New() *Store {
	return &Store{q: dbsqlc.New()}
}

// OperationInsertParams are the fields of a new operation.
type OperationInsertParams struct {
	ID          uuid.UUID
	Name        string
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
}

// OperationInsert reserves (Scope, Key) for a new operation. It returns false, and
// writes nothing, when the key is already taken.
func (s *Store) OperationInsert(ctx context.Context, db DBTX, p OperationInsertParams) (bool, error) {
	_, err := s.q.OperationInsert(ctx, db, dbsqlc.OperationInsertParams{
		ID:          pguuid.UUID(p.ID),
		Name:        p.Name,
		Scope:       p.Scope,
		Key:         p.Key,
		Steps:       p.Steps,
		Input:       p.Input,
		Fingerprint: nullJSON(p.Fingerprint),
		KeySecret:   p.KeySecret,
		LockedBy:    pguuid.Ptr(p.LockedBy),
		Lease:       p.Lease,
		Now:         p.Now,
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
		ID:          pguuid.UUID(p.ID),
		Name:        p.Name,
		Scope:       p.Scope,
		Key:         p.Key,
		Steps:       p.Steps,
		Input:       p.Input,
		Fingerprint: nullJSON(p.Fingerprint),
		KeySecret:   p.KeySecret,
		LockedBy:    pguuid.Ptr(p.LockedBy),
		Lease:       p.Lease,
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

// OperationClaim takes an operation in progress for run when nobody holds it (it
// waits for a job, or its holder's lease expired), and counts the run. A parked
// operation is taken only when parked is true. It returns ErrNotFound when the
// operation is finished, held by a live run, or parked (and parked is false).
func (s *Store) OperationClaim(ctx context.Context, db DBTX, id, run uuid.UUID, lease time.Duration, parked bool) (*Operation, error) {
	row, err := s.q.OperationClaim(ctx, db, dbsqlc.OperationClaimParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Lease: lease, Parked: parked})
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
func (s *Store) OperationRelease(ctx context.Context, db DBTX, id, run uuid.UUID, delay, lease time.Duration) (time.Time, bool, error) {
	runAt, err := s.q.OperationRelease(ctx, db, dbsqlc.OperationReleaseParams{ID: pguuid.UUID(id), RunID: pguuid.Ptr(&run), Delay: delay, Lease: lease})
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
	ID   uuid.UUID
	Name string
}

// OperationListExpired lists up to max operations in progress whose lease expired
// before now (nil: the database's clock), oldest lease first.
func (s *Store) OperationListExpired(ctx context.Context, db DBTX, max int, now *time.Time) ([]ExpiredOperation, error) {
	rows, err := s.q.OperationListExpired(ctx, db, dbsqlc.OperationListExpiredParams{Max: int32(max), Now: now})
	if err != nil {
		return nil, fmt.Errorf("store: list expired operations: %w", err)
	}
	out := make([]ExpiredOperation, len(rows))
	for i, r := range rows {
		out[i] = ExpiredOperation{ID: uuid.UUID(r.ID), Name: r.Name}
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

// StepListByOperation reads the recorded steps of an operation, in step order.
func (s *Store) StepListByOperation(ctx context.Context, db DBTX, operationID uuid.UUID) ([]Step, error) {
	rows, err := s.q.StepListByOperation(ctx, db, pguuid.UUID(operationID))
	if err != nil {
		return nil, fmt.Errorf("store: list steps: %w", err)
	}
	out := make([]Step, len(rows))
	for i, r := range rows {
		out[i] = Step{
			OperationID: uuid.UUID(r.OperationID),
			Name:        r.Name,
			Position:    int(r.Position),
			State:       StepState(r.State),
			Attempts:    int(r.Attempts),
			Output:      r.Output,
			StartedAt:   r.StartedAt,
			FinishedAt:  r.FinishedAt,
			LastError:   deref(r.LastError),
			LastCause:   deref(r.LastCause),
			ResolvedBy:  deref(r.ResolvedBy),
			// The step's own attempts and its compensation's are counted apart.
			Compensations: int(r.Compensations),
		}
	}
	return out, nil
}

// StepCheckpointParams describe a succeeded step, for StepCheckpointMany.
type StepCheckpointParams struct {
	Name     string
	Position int
	Attempts int
	Output   json.RawMessage
	// StartedAt is when the attempt that succeeded started.
	StartedAt time.Time
	// Retried is true when an earlier attempt failed and left the step's row,
	// which the checkpoint then updates; a step without a row gets one.
	Retried bool
	// ResolvedBy is "call" or "lookup" for an external step, empty for others.
	ResolvedBy string
}

// StepRecordFailureParams record a failed attempt of a step.
type StepRecordFailureParams struct {
	OperationID uuid.UUID
	Name        string
	Position    int
	// State is StepRetrying when another attempt follows, else StepFailed.
	State    StepState
	Attempts int
	// LastError is the failure's message for clients, LastCause for operators.
	LastError string
	LastCause string
	StartedAt time.Time
}

// StepRecordFailure records a failed attempt. A step already checkpointed keeps
// its record.
func (s *Store) StepRecordFailure(ctx context.Context, db DBTX, p StepRecordFailureParams) error {
	err := s.q.StepRecordFailure(ctx, db, dbsqlc.StepRecordFailureParams{
		OperationID: pguuid.UUID(p.OperationID),
		Name:        p.Name,
		Position:    int32(p.Position),
		State:       string(p.State),
		Attempts:    int32(p.Attempts),
		LastError:   ptr(Text(p.LastError)),
		LastCause:   ptr(Text(p.LastCause)),
		StartedAt:   p.StartedAt,
	})
	if err != nil {
		return fmt.Errorf("store: record failure of step %q: %w", p.Name, err)
	}
	return nil
}

// StepCompensationFailed records the failed attempt number n of a succeeded
// step's compensation, with its texts for the client and for operators.
func (s *Store) StepCompensationFailed(ctx context.Context, db DBTX, operationID uuid.UUID, name string, n int, lastError, lastCause string) error {
	err := s.q.StepCompensationFailed(ctx, db, dbsqlc.StepCompensationFailedParams{
		OperationID: pguuid.UUID(operationID), Name: name, Compensations: int32(n), LastError: ptr(Text(lastError)), LastCause: ptr(Text(lastCause)),
	})
	if err != nil {
		return fmt.Errorf("store: record failed compensation of step %q: %w", name, err)
	}
	return nil
}

// StepCompensated marks a succeeded step as compensated. It returns false when the
// step was not (or no longer) succeeded.
func (s *Store) StepCompensated(ctx context.Context, db DBTX, operationID uuid.UUID, name string) (bool, error) {
	n, err := s.q.StepCompensated(ctx, db, dbsqlc.StepCompensatedParams{OperationID: pguuid.UUID(operationID), Name: name})
	if err != nil {
		return false, fmt.Errorf("store: mark step %q compensated: %w", name, err)
	}
	return n == 1, nil
}

func operationFromRow(r *dbsqlc.IdemflowOperation) *Operation {
	return &Operation{
		ID:            uuid.UUID(r.ID),
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
		KeySecret:     r.KeySecret,
		AttentionCode: deref(r.AttentionCode),
		Attention:     deref(r.Attention),
		Parked:        r.Parked,
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// maxText bounds the texts the store keeps of a failure.
const maxText = 8 << 10

// Text returns s as PostgreSQL's text and jsonb can keep it: valid UTF-8 (an
// invalid byte becomes U+FFFD), no NUL byte, at most 8 KiB (cut on a rune
// boundary). A failure's text comes from anywhere (a provider's answer, a
// panic's value): one PostgreSQL refused would fail the very write that
// records the failure, every run, for ever.
func Text(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= maxText {
		return s
	}
	cut := maxText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// nullJSON turns an empty value into SQL NULL rather than an invalid empty document.
func nullJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	return b
}

func mapErr(what string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("store: %s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("store: %s: %w", what, err)
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

// OperationDeleteFinishedParams select finished operations to delete.
type OperationDeleteFinishedParams struct {
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
// progress again, its answer and attention cleared, its unsucceeded steps
// forgotten so that they run again, waiting for a job. It returns false when the
// operation is neither failed nor parked.
func (s *Store) OperationReopen(ctx context.Context, db DBTX, id uuid.UUID, lease time.Duration) (bool, error) {
	n, err := s.q.OperationReopen(ctx, db, dbsqlc.OperationReopenParams{ID: pguuid.UUID(id), Lease: lease})
	if err != nil {
		return false, fmt.Errorf("store: reopen operation: %w", err)
	}
	if n == 0 {
		return false, nil
	}
	if err := s.q.StepDeleteUnsucceeded(ctx, db, pguuid.UUID(id)); err != nil {
		return false, fmt.Errorf("store: reopen operation: %w", err)
	}
	if err := s.q.StepResetSucceeded(ctx, db, pguuid.UUID(id)); err != nil {
		return false, fmt.Errorf("store: reopen operation: %w", err)
	}
	return true, nil
}

// OperationList lists up to max operations in state, newest first.
func (s *Store) OperationList(ctx context.Context, db DBTX, state OperationState, max int) ([]*Operation, error) {
	rows, err := s.q.OperationList(ctx, db, dbsqlc.OperationListParams{State: string(state), Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("store: list operations: %w", err)
	}
	out := make([]*Operation, len(rows))
	for i, r := range rows {
		out[i] = operationFromRow(r)
	}
	return out, nil
}

// StepCheckpointManyParams record succeeded steps and, optionally, end their
// operation.
type StepCheckpointManyParams struct {
	OperationID uuid.UUID
	Steps       []StepCheckpointParams
	// Finish ends the operation in State with Result or Error, fenced by Run.
	Finish bool
	Run    uuid.UUID
	State  OperationState
	Result json.RawMessage
	Error  json.RawMessage
}

// StepCheckpointMany records p.Steps as succeeded and, with p.Finish, ends the
// operation, in one or two statements: the steps whose row an earlier failed
// attempt left (Retried) are updated by one; the others are inserted by
// another, which with p.Finish is the one that ends the operation. Each
// fails, with ErrFenced and the transaction aborted, when another run recorded
// one of the steps first or no longer lets p.Run end the operation, so that a
// COMMIT queued after them never commits what they did not. With a Queue for
// db they are only queued, and their errors come back with the batch's results
// (see Err).
func (s *Store) StepCheckpointMany(ctx context.Context, db DBTX, p StepCheckpointManyParams) error {
	var fresh, retried []StepCheckpointParams
	for _, st := range p.Steps {
		if st.Retried {
			retried = append(retried, st)
		} else {
			fresh = append(fresh, st)
		}
	}
	cols := stepColumnsOf(fresh)
	if len(fresh) > 0 && !p.Finish {
		args := dbsqlc.StepInsertSucceededParams{
			OperationID: pguuid.UUID(p.OperationID),
			Names:       cols.names,
			Positions:   cols.positions,
			Attempts:    cols.attempts,
			Outputs:     cols.outputs,
			ResolvedBys: cols.resolvedBys,
			StartedAts:  cols.startedAts,
		}
		if err := s.q.StepInsertSucceeded(ctx, db, args); err != nil {
			return fmt.Errorf("store: checkpoint steps: %w", Err(err))
		}
	}
	if len(retried) > 0 {
		rc := stepColumnsOf(retried)
		args := dbsqlc.StepUpdateSucceededParams{
			OperationID: pguuid.UUID(p.OperationID),
			Names:       rc.names,
			Attempts:    rc.attempts,
			Outputs:     rc.outputs,
			ResolvedBys: rc.resolvedBys,
		}
		if err := s.q.StepUpdateSucceeded(ctx, db, args); err != nil {
			return fmt.Errorf("store: checkpoint retried steps: %w", Err(err))
		}
	}
	if p.Finish {
		args := dbsqlc.OperationFinishParams{
			OperationID: pguuid.UUID(p.OperationID),
			RunID:       pguuid.UUID(p.Run),
			State:       string(p.State),
			Result:      nullJSON(p.Result),
			Error:       nullJSON(p.Error),
			Names:       cols.names,
			Positions:   cols.positions,
			Attempts:    cols.attempts,
			Outputs:     cols.outputs,
			ResolvedBys: cols.resolvedBys,
			StartedAts:  cols.startedAts,
		}
		err := s.q.OperationFinish(ctx, db, args)
		if err != nil {
			return fmt.Errorf("store: finish operation: %w", Err(err))
		}
	}
	return nil
}

// stepColumns are checkpoints as the queries take them: one array per column,
// one step per index.
type stepColumns struct {
	names       []string
	positions   []int32
	attempts    []int32
	outputs     []string
	resolvedBys []string
	startedAts  []time.Time
}

func stepColumnsOf(steps []StepCheckpointParams) stepColumns {
	c := stepColumns{
		names:       make([]string, len(steps)),
		positions:   make([]int32, len(steps)),
		attempts:    make([]int32, len(steps)),
		outputs:     make([]string, len(steps)),
		resolvedBys: make([]string, len(steps)),
		startedAts:  make([]time.Time, len(steps)),
	}
	for i, st := range steps {
		c.names[i] = st.Name
		c.positions[i] = int32(st.Position)
		c.attempts[i] = int32(st.Attempts)
		c.outputs[i] = string(st.Output)
		c.resolvedBys[i] = st.ResolvedBy
		c.startedAts[i] = st.StartedAt
	}
	return c
}
