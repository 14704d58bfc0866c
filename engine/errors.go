package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/store"
)

// Mistakes in the definitions given to NewOperation and New, and a Start of
// an operation type New was not given.
var (
	errDuplicateStep      = errors.New("duplicate step name")
	errDuplicateOperation = errors.New("duplicate operation name")
	errNotRegistered      = errors.New("operation type not registered")
)

var (
	// ErrNotSucceeded is returned when a result is asked of an operation that did
	// not succeed.
	ErrNotSucceeded = errors.New("operation did not succeed")
	// ErrInvalidKey is returned by Start for an empty idempotency key.
	ErrInvalidKey = errors.New("invalid idempotency key")
	// ErrStopped is returned by Start once the engine is stopping.
	ErrStopped = errors.New("engine stopped")
	// ErrOverloaded is returned by Start, at once and with nothing reserved,
	// when Config.MaxInFlight first attempts already run in this process and
	// the key is free (a start whose key is taken is answered as always).
	ErrOverloaded = errors.New("too many operations in flight")
	// ErrScopeBusy is returned by Start, at once and with nothing reserved,
	// when the scope has Config.MaxInFlightPerScope operations running in this
	// process: the client is over its share, the others are not; it may retry
	// the same key later.
	ErrScopeBusy = errors.New("too many operations of this scope in flight")
	// errAccepted is matched by the error of Pending: an external call that the
	// outside service accepted, with its final outcome to come, or a lookup
	// that found the call still being processed.
	errAccepted = errors.New("outcome pending")
	// errUnavailable is matched by the error of a Start that could not reach the
	// database, or got no answer in time: nothing was reserved, or (when the
	// answer was lost) the key's operation runs and a retry finds it. It is
	// also the error of a Start whose reservation waited out lock_timeout on
	// another start's reservation of the key, not yet committed: a retry finds
	// whichever way it ended.
	errUnavailable = errors.New("database unavailable")
	// ErrNotMigrated is matched by the error of NewAdmin and StartWorkers for a
	// database without idemflow's tables, or with an older version of them.
	ErrNotMigrated = store.ErrNotMigrated
	// ErrIncompatibleSchema is matched by the error of Health, and of the
	// starts and reads that this process refuses, once a newer build migrated
	// the database past this build's migrations by one that is not rolling:
	// this build's statements fail on the schema it made (see Health).
	// IsUnavailable is true of it: another process, of the newer build, can
	// serve.
	ErrIncompatibleSchema = errors.New("the database's schema is newer than this build's, and this build's statements fail on it")
	// ErrNotCarriedOut is matched by the error of an Admin request that no live process
	// has carried out before ctx ended: it stays recorded, and a process that runs
	// the operation's definition carries it out when it comes.
	ErrNotCarriedOut = errors.New("the request is recorded; no process has carried it out yet")
	// errOwnedTx is returned by Commit and Rollback on the pgx.Tx that PgxTx gives:
	// the engine ends a step's transaction, with the step's checkpoint.
	errOwnedTx = errors.New("engine: a step's transaction is committed or rolled back by the engine")
)

// Refusal is why the engine refused a request, changing nothing: a typed
// code, the one the audit trail keeps (AuditEntry) and that opsweb and the
// CLI answer with. Each Refusal is an error; what an operator's request
// returns for one is a *RefusedError, which errors.Is matches against its
// Refusal. Switch on it with errors.As:
//
//	var r engine.Refusal
//	if errors.As(err, &r) { switch r { ... } }
type Refusal string

// Error implements error.
func (r Refusal) Error() string {
	if text, ok := refusalTexts[r]; ok {
		return text
	}
	return string(r)
}

// The refusals.
const (
	// ErrNotFound is returned when an operation does not exist.
	ErrNotFound Refusal = "not_found"
	// ErrReasonRequired: an approval or a rejection without a reason.
	ErrReasonRequired Refusal = "reason_required"
	// ErrInvalidResolution is matched by the error of a Resolve whose Resolution
	// lacks what it needs (a reason; a reference for a step that records one).
	ErrInvalidResolution Refusal = "invalid_resolution"
	// ErrPastPivot is returned by Cancel for an operation past its point of no
	// return (see the package documentation, "Failure"), or one whose pivot's
	// outcome nobody can tell: it only goes forward.
	ErrPastPivot Refusal = "past_point_of_no_return"
	// ErrOutcomeUnknown is matched by the *RefusedError of a Cancel that
	// would have to guess whether a call went through.
	ErrOutcomeUnknown Refusal = "outcome_unknown"
	// ErrFinal is returned by Retry, changing nothing, for an operation whose
	// answer is final: it ended with a business answer (Fail) or an operator's
	// cancel, or, without RetryOpts.Force, with a server fault.
	ErrFinal Refusal = "operation_final"
	// ErrFinished is returned by Cancel for an operation that has finished.
	ErrFinished Refusal = "operation_finished"
	// ErrWaitOver: a signal, an approval or a rejection came after the
	// deadline of the step that waited for it (the deadline won), or after
	// that step was decided.
	ErrWaitOver Refusal = "wait_over"
	// ErrNotAwaitingApproval: an approval or a rejection of an operation in
	// progress that does not wait for approval.
	ErrNotAwaitingApproval Refusal = "not_awaiting_approval"
	// ErrNotFailed is returned by Retry for an operation that has neither failed
	// nor been parked.
	ErrNotFailed Refusal = "operation_not_failed"
	// ErrCompensated is returned by Retry, changing nothing, for an operation
	// that would go forward although a step of it that calls out was
	// compensated: its call, made again under the same derived key, would be
	// answered with the one that was undone.
	ErrCompensated Refusal = "operation_compensated"
	// ErrRunning is returned by Cancel and Retry for an operation that a live
	// run holds.
	ErrRunning Refusal = "held_by_live_process"
	// ErrNotResolvable is returned by Resolve, changing nothing, for an operation
	// that is not waiting on an external step's outcome an operator may decide:
	// finished, running, compensating, or stopped at a step that does not call
	// out.
	ErrNotResolvable Refusal = "not_resolvable"
	// ErrResolutionContradicts is matched by the error of a Resolve, which
	// changed nothing, whose word the step's lookup contradicts: "made" while the
	// service has nothing under the key, another reference or a pending call;
	// "not made" while it has the call.
	ErrResolutionContradicts Refusal = "resolution_contradicts_provider"
	// ErrUnknownSource is returned for a source name that Config.Reconcile does
	// not have.
	ErrUnknownSource Refusal = "unknown_source"
	// ErrInvalidCursor is returned by MismatchList for an After that is not
	// a Next it gave.
	ErrInvalidCursor Refusal = "invalid_cursor"
	// errCannotCancel: Cancel would need the input or state of an operation
	// whose stored state does not decode.
	errCannotCancel Refusal = "cannot_cancel"
)

var refusalTexts = map[Refusal]string{
	ErrNotFound:              "operation not found",
	ErrReasonRequired:        "a reason is required",
	ErrInvalidResolution:     "invalid resolution",
	ErrPastPivot:             "operation is past its point of no return",
	ErrOutcomeUnknown:        "the outcome of a call is not known yet",
	ErrFinal:                 "the operation's answer is final",
	ErrFinished:              "operation has finished",
	ErrWaitOver:              "the wait is over",
	ErrNotAwaitingApproval:   "the operation does not wait for approval",
	ErrNotFailed:             "operation has not failed and is not parked",
	ErrCompensated:           "a step that calls out was compensated",
	ErrRunning:               "operation is running",
	ErrNotResolvable:         "operation is not resolvable",
	ErrResolutionContradicts: "the resolution contradicts the outside service",
	ErrUnknownSource:         "no such reconciliation source",
	ErrInvalidCursor:         "invalid cursor",
	errCannotCancel:          "operation cannot be cancelled",
}

// RefusedError is an operator's request refused (Retry, Cancel, Resolve,
// Approve, Reject; Engine's and Admin's alike), changing nothing. It matches
// its Refusal with errors.Is.
type RefusedError struct {
	// Refusal is why.
	Refusal Refusal
	// Operation is the operation the request named.
	Operation uuid.UUID
	// Step, for ErrOutcomeUnknown, is the external step whose outcome is not
	// known yet; Accepted is true when the outside service accepted its call
	// and has not settled it; KnownAt is when its outcome will be known at
	// the latest (the end of its outcome window), zero when that cannot be
	// said.
	Step     string
	Accepted bool
	KnownAt  time.Time
	// Reason says why, for operators.
	Reason string
	// err is the error the refusal was found in, which errors.Is and
	// errors.As see through too.
	err error
}

// Error implements error.
func (e *RefusedError) Error() string {
	text := "engine: " + e.Reason
	switch {
	case e.Step != "":
		text = fmt.Sprintf("engine: the outcome of step %s is not known yet: %s", e.Step, e.Reason)
	case e.Reason == "":
		text = "engine: " + e.Refusal.Error()
	}
	if !e.KnownAt.IsZero() {
		text += "; it will be known by " + e.KnownAt.UTC().Format(time.RFC3339)
	}
	return text
}

// Unwrap returns the Refusal, which errors.Is and errors.As find, and the
// error the refusal was found in, if any.
func (e *RefusedError) Unwrap() []error {
	if e.err == nil {
		return []error{e.Refusal}
	}
	return []error{e.Refusal, e.err}
}

// refusedOf is err as an operator's request returns it: a *RefusedError for
// a refusal, naming operation id, with err's text; err itself otherwise.
func refusedOf(id uuid.UUID, err error) error {
	var r Refusal
	if err == nil || !errors.As(err, &r) {
		return err
	}
	if inner := (*RefusedError)(nil); errors.As(err, &inner) {
		if inner == err {
			if inner.Operation == uuid.Nil {
				inner.Operation = id
			}
			return inner
		}
		re := *inner
		if re.Operation == uuid.Nil {
			re.Operation = id
		}
		re.err = err
		return &re
	}
	return &RefusedError{Refusal: r, Operation: id, Reason: strings.TrimPrefix(err.Error(), "engine: "), err: err}
}

// IsUnavailable reports whether err says that the database could not be
// reached or did not answer in time (a refused or lost connection, a timeout,
// a statement's or a lock wait's included, a server shutting down or out of
// connections), rather than answered, or that this process cannot use the
// database's schema (ErrIncompatibleSchema): what an HTTP layer answers 503
// with Retry-After for.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errUnavailable) || errors.Is(err, ErrIncompatibleSchema) || errors.Is(err, errLeaseExpiring) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", // shutting down, cannot connect now
			pgErr.Code == "53300", // too many connections
			pgErr.Code == "57014", // statement timeout, or cancelled
			pgErr.Code == "55P03": // lock timeout
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) || pgconn.Timeout(err)
}

// FailureCode is the code of an operation's failure (PermanentError.Code):
// the engine's own, below, or one a step gives (Fail, Halt's code when it
// parks). It is stored with the answer, and served.
type FailureCode string

// The codes that the engine itself gives the failures of operations. Codes
// that steps give (engine.Fail) are theirs.
const (
	// CodeAttemptsExhausted: a step failed transiently more often than its retry
	// policy allows. A server fault.
	CodeAttemptsExhausted FailureCode = "attempts_exhausted"
	// CodeResultFailed: the operation's result function returned an error. A
	// server fault.
	CodeResultFailed FailureCode = "result_failed"
	// CodePermanent: a step returned an error marked with Permanent. A server
	// fault.
	CodePermanent FailureCode = "permanent"
	// CodeCancelled: an operator cancelled the operation (Engine.Cancel).
	CodeCancelled FailureCode = "cancelled"
	// CodeRejected: an operator rejected the operation at its ApprovalStep
	// (Engine.Reject). A business failure (ApprovalStepDef.Codes may name
	// it otherwise).
	CodeRejected FailureCode = "rejected"
	// CodeApprovalExpired: an ApprovalStep's wait expired before enough
	// operators approved. A business failure (ApprovalStepDef.Codes may
	// name it otherwise).
	CodeApprovalExpired FailureCode = "approval_expired"
	// CodeSignalTimeout: a SignalStep's deadline passed with no signal, and
	// it has no timeout function. A business failure.
	CodeSignalTimeout FailureCode = "signal_timeout"
	// CodeUnreadableError: the stored error could not be decoded. A server fault.
	CodeUnreadableError FailureCode = "unreadable_error"
	// CodeResolvedNotMade is the error of an operation whose external step an
	// operator resolved as not made: a server fault (its client is answered as
	// for a step out of attempts).
	CodeResolvedNotMade FailureCode = "resolved_not_made"
)

// AttentionCode says why an operation needs an operator (Attention.Code): one
// of the engine's, below, or the code of a step's Halt.
type AttentionCode string

// The reasons the engine gives an operation's need of attention.
const (
	// CodeCompensationFailed: a compensation failed for good, and the
	// operation, half undone, is parked for an operator (whose retry goes on
	// compensating). Operations that ended failed with it before version 0.2
	// keep it as their error's code, a server fault.
	CodeCompensationFailed AttentionCode = "compensation_failed"
	// CodeRetryingPastPivot (attention): a step after the point of no return
	// keeps failing; it is retried at its policy's cap until it succeeds.
	CodeRetryingPastPivot AttentionCode = "retrying_past_pivot"
	// CodeFailedPastPivot (attention, parked): a step after the point of no
	// return failed for good, or the result function failed there: the
	// operation can go neither forward nor back without an operator.
	CodeFailedPastPivot AttentionCode = "failed_past_pivot"
	// CodeOutcomeUnknown (attention, parked): an external step without a lookup
	// ran out of attempts; whether its call went through cannot be told, so
	// nothing is compensated.
	CodeOutcomeUnknown AttentionCode = "outcome_unknown"
	// CodeOutcomeOverdue (attention): an external step that waits for its
	// outcome (see Accepted and ExternalStepDef.Window) has none past its
	// outcome window: the call is still pending, or its lookup cannot answer.
	// The operation goes on waiting; an operator may settle it.
	CodeOutcomeOverdue AttentionCode = "outcome_overdue"
	// CodeDatabaseUnavailable (attention): a transactional step has not
	// reached the database (lock or statement timeouts, lost connections) for
	// longer than its retry policy's cap (at least a minute); it is retried
	// without using up its attempts meanwhile.
	CodeDatabaseUnavailable AttentionCode = "database_unavailable"
	// CodeUndecodableState (attention, parked): the operation's stored input or
	// state does not decode into this process's types.
	CodeUndecodableState AttentionCode = "undecodable_state"
	// CodeDefinitionChanged (attention): this process's definition lacks a step
	// that the operation still needs; it waits for a process that has it.
	CodeDefinitionChanged AttentionCode = "definition_changed"
	// CodeVersionNotRun (attention, never stored): the operation is in
	// progress on a version that no live process runs (none that runs
	// workers has it), while one runs another version of its name: a deploy
	// moved on without it. It waits for a process that runs its version.
	CodeVersionNotRun AttentionCode = "version_not_run"
	// CodeReconciliationMismatch (attention, never stored; finished
	// operations too): a reconciliation mismatch names the operation (see
	// Engine.Reconcile, Info.Mismatches).
	CodeReconciliationMismatch AttentionCode = "reconciliation_mismatch"
)

// ReusedError refuses, changing nothing, an id used again with other
// content: an idempotency key (Start: another input), an event id
// (RecordOutcome: another outcome under the same key) or a signal id
// (Signal: another name or payload). errors.As finds it.
type ReusedError struct {
	// What was used again: "key", "event" or "signal".
	What string
	// ID is the key or id.
	ID string
	// Operation is the operation that holds it, when known.
	Operation uuid.UUID
	// Fields are the names that differ, sorted. For a key: top-level fields
	// of the input (or those of the caller's Fingerprint), and context names
	// (such as an HTTP request's "method" and "path"). For an event: "amount",
	// "data", "failure", "reference", "status". For a signal: "name",
	// "payload".
	Fields []string
}

// Error implements error.
func (e *ReusedError) Error() string {
	differ := strings.Join(e.Fields, ", ")
	switch e.What {
	case "key":
		return fmt.Sprintf("engine: idempotency key reused with a different input: operation %s holds the key; fields that differ: %s", e.Operation, differ)
	case "event":
		return fmt.Sprintf("engine: event id reused with another outcome: event %s; fields that differ: %s", e.ID, differ)
	}
	return fmt.Sprintf("engine: %s id reused: %s %s; fields that differ: %s", e.What, e.What, e.ID, differ)
}

// versionError says why a process cannot run an operation: its definition of the
// operation's type lacks a step that the operation still needs. The operation
// waits, needing attention (CodeDefinitionChanged), for a process that has it.
type versionError struct {
	Operation string
	// Started is the step list the operation was started with.
	Started []string
	// Registered is the step list of this process's definition.
	Registered []string
	// Missing are the steps the operation still needs that Registered lacks.
	Missing []string
}

// Error implements error.
func (e *versionError) Error() string {
	return fmt.Sprintf("operation %s was started with steps %q, but this process defines %q: missing %q",
		e.Operation, e.Started, e.Registered, e.Missing)
}

// lockNotAvailable reports whether err is PostgreSQL's lock_not_available
// (55P03): a statement that waited out lock_timeout, and did nothing.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// refusalCode is err's refusal code; "" for an error that is no refusal.
func refusalCode(err error) string {
	var r Refusal
	if errors.As(err, &r) {
		return string(r)
	}
	return ""
}

// refused rebuilds the refusal kept with code and text by a request carried
// out elsewhere.
func refused(id uuid.UUID, code, text string) error {
	if _, ok := refusalTexts[Refusal(code)]; !ok {
		return errors.New(text)
	}
	return &RefusedError{Refusal: Refusal(code), Operation: id, Reason: strings.TrimPrefix(text, "engine: ")}
}
