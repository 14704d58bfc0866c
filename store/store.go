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
	if oe := outcomeErr(pgErr); oe != nil {
		return oe
	}
	switch {
	case pgErr.Code == fencedCode:
		return fmt.Errorf("%w: %w", ErrFenced, err)
	case pgErr.Code == uniqueViolation && pgErr.ConstraintName == "idemflow_operation_scope_key":
		return fmt.Errorf("%w: %w", ErrKeyTaken, err)
	case pgErr.Code == uniqueViolation && pgErr.ConstraintName == "idemflow_step_row_pkey":
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
	return FailedRow(errQueueRead)
}

// FailedRow returns a row whose Scan fails with err: what a DBTX that cannot
// read answers a QueryRow with.
func FailedRow(err error) pgx.Row { return failedRow{err} }

type failedRow struct{ err error }

func (r failedRow) Scan(...any) error { return r.err }

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
	// StepWaiting: the step waits for its outcome, with no attempt to follow:
	// its call got no definite answer and it is out of attempts, or the
	// outside service accepted it and gives its final status later (Pending).
	StepWaiting StepState = "waiting"
	// StepSucceeded: the step is checkpointed and never runs again.
	StepSucceeded StepState = "succeeded"
	// StepFailed: the step failed for good and ended its operation.
	StepFailed StepState = "failed"
	// StepCompensated: the step had succeeded, and its compensation has run.
	StepCompensated StepState = "compensated"
)

// Operation is a row of idemflow_operation.
type Operation struct {
	ID   uuid.UUID
	Name string
	// Version is the version of the definition the operation runs on.
	Version int
	Scope   string
	Key     string
	State   OperationState
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
	// PriorError is the error of a failed operation that an operator reopened
	// by force, kept until it finishes again.
	PriorError json.RawMessage
	// CallsUntil, when not nil, is when a run that held the operation may
	// have been calling out until, with no failure recorded: the lease end of
	// a run whose lease expired, or when a stopped run let go of it.
	CallsUntil *time.Time
	// Mismatched is true when a reconciliation mismatch names the operation
	// (OperationList fills it).
	Mismatched bool
	// VersionWaiting is true when the operation is in progress on a version
	// that no live process runs, while one runs another version of its name
	// (OperationList fills it).
	VersionWaiting bool
}

// Step is a recorded step: a row of idemflow_step_row, or a checkpoint in its
// operation's row (both read through the view idemflow_step_recorded).
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
	// ResolvedBy is "call", "lookup", "event" or "operator" for an external
	// step that succeeded.
	ResolvedBy string
	// Compensations counts the failed attempts of the step's compensation.
	Compensations int
	StartedAt     time.Time
	FinishedAt    *time.Time
	// SentAt is when the step's last request was sent at the latest (the end
	// of its last attempt that called out), nil when no failed attempt
	// recorded one.
	SentAt *time.Time
	// Pending is true for a waiting step whose call the outside service
	// accepted, with its final status to come.
	Pending bool
	// WaitingSince is when a waiting step began waiting.
	WaitingSince *time.Time
	// SettleBy is when a request of the step that got no definite answer can
	// no longer land, by the database's clock; nil when none was recorded.
	SettleBy *time.Time
	// Reference is the outside service's reference of a call it accepted as
	// pending; empty when none was told.
	Reference string
	// WaitReason is why a step that waits for people or time waits:
	// "signal", "timer" or "approval" (empty for an external step);
	// WaitSignal the signal it waits for, WaitUntil its deadline or moment
	// (nil: none), WaitNeed the approvals it needs. All are fixed when the
	// step was reached.
	WaitReason string
	WaitSignal string
	WaitUntil  *time.Time
	WaitNeed   int
}

// Store runs idemflow's queries. The zero value is not usable: call New.
type Store struct {
	q *dbsqlc.Queries
}

// New returns a Store.
func New() *Store {
	return &Store{q: dbsqlc.New()}
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
