package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/store"
)

var (
	// ErrDuplicateStep is returned by NewOperation when two steps share a name.
	ErrDuplicateStep = errors.New("duplicate step name")
	// ErrDuplicateOperation is returned by New when two operation types share a name.
	ErrDuplicateOperation = errors.New("duplicate operation name")
	// ErrNotRegistered is returned when an operation type was not given to New.
	ErrNotRegistered = errors.New("operation type not registered")
	// ErrNotFound is returned when an operation does not exist.
	ErrNotFound = errors.New("operation not found")
	// ErrNotSucceeded is returned when a result is asked of an operation that did
	// not succeed.
	ErrNotSucceeded = errors.New("operation did not succeed")
	// ErrInvalidKey is returned by Start for an empty idempotency key.
	ErrInvalidKey = errors.New("invalid idempotency key")
	// ErrStopped is returned by Start once the engine is stopping.
	ErrStopped = errors.New("engine stopped")
	// ErrRunning is returned by Cancel and Reopen for an operation that a live
	// run holds.
	ErrRunning = errors.New("operation is running")
	// ErrNotFailed is returned by Reopen for an operation that has neither failed
	// nor been parked.
	ErrNotFailed = errors.New("operation has not failed and is not parked")
	// ErrCompensated is returned by Reopen, changing nothing, for an operation
	// that would go forward although a step of it that calls out was
	// compensated: its call, made again under the same derived key, would be
	// answered with the one that was undone.
	ErrCompensated = errors.New("a step that calls out was compensated")
	// ErrFinished is returned by Cancel for an operation that has finished.
	ErrFinished = errors.New("operation has finished")
	// ErrPastPivot is returned by Cancel for an operation past its point of no
	// return (see the package documentation, "Failure"), or one whose pivot's
	// outcome nobody can tell: it only goes forward.
	ErrPastPivot = errors.New("operation is past its point of no return")
	// ErrKeyReused is matched by the *KeyReusedError of a Start whose key an
	// operation with another input holds.
	ErrKeyReused = errors.New("idempotency key reused with a different input")
	// ErrOverloaded is returned by Start, at once and with nothing reserved,
	// when Config.MaxInFlight first attempts already run in this process and
	// the key is free (a start whose key is taken is answered as always).
	ErrOverloaded = errors.New("too many operations in flight")
	// ErrOutcomePending is matched by the error of Pending: an external call that the
	// outside service accepted, with its final outcome to come, or a lookup
	// that found the call still being processed.
	ErrOutcomePending = errors.New("outcome pending")
	// ErrOutcomeUnknown is matched by the *OutcomeUnknownError of a Cancel that
	// would have to guess whether a call went through.
	ErrOutcomeUnknown = errors.New("the outcome of a call is not known yet")
	// ErrFinal is returned by Reopen, changing nothing, for an operation whose
	// answer is final: it ended with a business answer (Fail) or an operator's
	// cancel, or, without ReopenOpts.Force, with a server fault.
	ErrFinal = errors.New("the operation's answer is final")
	// ErrUnavailable is matched by the error of a Start that could not reach the
	// database, or got no answer in time: nothing was reserved, or (when the
	// answer was lost) the key's operation runs and a retry finds it. It is
	// also the error of a Start whose reservation waited out lock_timeout on
	// another start's reservation of the key, not yet committed: a retry finds
	// whichever way it ended.
	ErrUnavailable = errors.New("database unavailable")
)

// IsUnavailable reports whether err says that the database could not be
// reached or did not answer in time (a refused or lost connection, a timeout,
// a statement's or a lock wait's included, a server shutting down or out of
// connections), rather than answered: what an HTTP layer answers 503 with
// Retry-After for.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, errLeaseExpiring) || errors.Is(err, context.DeadlineExceeded) ||
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

// The codes that the engine itself gives the failures of operations and the
// reasons an operation needs attention. Codes that steps give (engine.Fail)
// are theirs.
const (
	// CodeAttemptsExhausted: a step failed transiently more often than its retry
	// policy allows. A server fault.
	CodeAttemptsExhausted = "attempts_exhausted"
	// CodeCompensationFailed: a compensation failed for good, and the
	// operation, half undone, is parked for an operator (whose retry goes on
	// compensating). Operations that ended failed with it before version 0.2
	// keep it as their error's code, a server fault.
	CodeCompensationFailed = "compensation_failed"
	// CodeResultFailed: the operation's result function returned an error. A
	// server fault.
	CodeResultFailed = "result_failed"
	// CodePermanent: a step returned an error marked with Permanent. A server
	// fault.
	CodePermanent = "permanent"
	// CodeCancelled: an operator cancelled the operation (Engine.Cancel).
	CodeCancelled = "cancelled"
	// CodeUnreadableError: the stored error could not be decoded. A server fault.
	CodeUnreadableError = "unreadable_error"

	// CodeRetryingPastPivot (attention): a step after the point of no return
	// keeps failing; it is retried at its policy's cap until it succeeds.
	CodeRetryingPastPivot = "retrying_past_pivot"
	// CodeFailedPastPivot (attention, parked): a step after the point of no
	// return failed for good, or the result function failed there: the
	// operation can go neither forward nor back without an operator.
	CodeFailedPastPivot = "failed_past_pivot"
	// CodeOutcomeUnknown (attention, parked): an external step without a lookup
	// ran out of attempts; whether its call went through cannot be told, so
	// nothing is compensated.
	CodeOutcomeUnknown = "outcome_unknown"
	// CodeOutcomeOverdue (attention): an external step that waits for its
	// outcome (see Pending and ExternalStepDef.Settle) has none past its
	// settle window: the call is still pending, or its lookup cannot answer.
	// The operation goes on waiting; an operator may settle it.
	CodeOutcomeOverdue = "outcome_overdue"
	// CodeDatabaseUnavailable (attention): a transactional step has not
	// reached the database (lock or statement timeouts, lost connections) for
	// longer than its retry policy's cap (at least a minute); it is retried
	// without using up its attempts meanwhile.
	CodeDatabaseUnavailable = "database_unavailable"
	// CodeUndecodableState (attention, parked): the operation's stored input or
	// state does not decode into this process's types.
	CodeUndecodableState = "undecodable_state"
	// CodeDefinitionChanged (attention): this process's definition lacks a step
	// that the operation still needs; it waits for a process that has it.
	CodeDefinitionChanged = "definition_changed"
	// CodeVersionNotRun (attention, never stored): the operation is in
	// progress on a version that no live process runs (none that runs
	// workers has it), while one runs another version of its name: a deploy
	// moved on without it. It waits for a process that runs its version.
	CodeVersionNotRun = "version_not_run"
	// CodeReconciliationMismatch (attention, never stored; finished
	// operations too): a reconciliation mismatch names the operation (see
	// Engine.Reconcile, Info.Mismatches).
	CodeReconciliationMismatch = "reconciliation_mismatch"
)

// serverFaultMessage is what a client is told of a server fault.
const serverFaultMessage = "the operation failed because of a server fault"

// PermanentError is a failure that no retry can mend: the engine does not try the
// step again, runs the compensations of the steps that succeeded (only before
// the operation's point of no return), and ends the operation failed with this
// error recorded. Make one with Fail or Permanent.
//
// It is stored with the operation and read back by Info.Error, so it is what a
// replay of the operation reports: Message is for the client, Cause for
// operators.
type PermanentError struct {
	// Code is a short machine-readable reason, such as "amount_exceeds_refundable".
	Code string `json:"code"`
	// Message is for the client: it names nothing internal.
	Message string `json:"message"`
	// Cause is for operators: what broke, with whatever internal detail (an SQL
	// error, a URL). Empty when Message says it all.
	Cause string `json:"cause,omitempty"`
	// Details are optional JSON details stored with the error, for the client.
	Details json.RawMessage `json:"details,omitempty"`
	// Step names the step that failed. The engine fills it in.
	Step string `json:"step,omitempty"`
	// Fault is true for a server fault (a step out of attempts, a failed
	// compensation or result function, an error marked with Permanent) rather
	// than a business answer (Fail): see ServerFault.
	Fault bool `json:"fault,omitempty"`

	err error
}

// Fail returns a PermanentError with the given code and message: a business
// answer, such as a declined payment, which the client is told as it is.
//
// A step's SQL can fail the step the same way: SELECT idemflow_fail(code,
// message) (a function of idemflow's migrations) raises SQLSTATE IF002, which
// the engine turns into Fail(code, message) when the step returns the error, or
// when the statement was sent with AtCommit.
func Fail(code, message string) *PermanentError {
	return &PermanentError{Code: code, Message: message}
}

// failCode is the SQLSTATE that idemflow_fail raises.
const failCode = "IF002"

// fromSQL returns err as a PermanentError when it is, or wraps, the error of
// idemflow_fail, and err itself otherwise.
func fromSQL(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == failCode {
		return &PermanentError{Code: pgErr.Detail, Message: pgErr.Message, err: err}
	}
	return err
}

// Permanent marks err as permanent, with the code CodePermanent: a server fault
// whose text (err's) goes to operators only. A nil err gives nil; a
// *PermanentError is returned as it is.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return err
	}
	return &PermanentError{Code: CodePermanent, Message: serverFaultMessage, Cause: err.Error(), Fault: true, err: err}
}

// Pending returns an error that says an external call has no final outcome
// yet, matched by ErrOutcomePending. An external step returns it when the outside
// service accepted the call and settles it later (a pending refund, an ACH
// payout): the step waits, and the operation with it, with no run holding it,
// until its lookup finds the outcome final, the application settles it
// (SettleSucceeded, SettleFailed) or an operator does. A lookup returns it
// when the service has the call but is still processing it. reason is for
// operators.
func Pending(reason string) error {
	return fmt.Errorf("%w: %s", ErrOutcomePending, reason)
}

// OutcomeUnknownError is Cancel's refusal of an operation whose external step
// may still have an effect: its last request may still land, or the outside
// service has it pending, or its lookup cannot tell.
type OutcomeUnknownError struct {
	// Step is the external step whose outcome is not known.
	Step string
	// Pending is true when the outside service accepted the call and has not
	// settled it.
	Pending bool
	// KnownAt is when the outcome will be known at the latest (the end of the
	// step's settle window), zero when that cannot be said.
	KnownAt time.Time
	// Reason says why, for operators.
	Reason string
}

// Error implements error.
func (e *OutcomeUnknownError) Error() string {
	text := fmt.Sprintf("the outcome of step %s is not known yet: %s", e.Step, e.Reason)
	if !e.KnownAt.IsZero() {
		text += "; it will be known by " + e.KnownAt.UTC().Format(time.RFC3339)
	}
	return text
}

// Is reports whether target is ErrOutcomeUnknown.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// RetryAfterError is a transient failure that names how long to wait before the
// next attempt, such as an HTTP 429 or 503 with Retry-After. Make one with
// RetryAfter.
type RetryAfterError struct {
	// After is the least time to wait before the next attempt.
	After time.Duration
	err   error
}

// RetryAfter marks err as transient, with the next attempt not before after: the
// step's backoff, or after when it is longer, at most the retry policy's Cap. A
// nil err gives nil.
func RetryAfter(err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{After: after, err: err}
}

func (e *RetryAfterError) Error() string { return e.err.Error() }

// Unwrap returns the failure.
func (e *RetryAfterError) Unwrap() error { return e.err }

// backoff is the delay before the attempt after failed attempt number attempt,
// which failed with err: policy's backoff, or what err asks when that is longer,
// at most Cap.
func backoff(policy RetryPolicy, attempt int, err error) time.Duration {
	d := policy.Backoff(attempt)
	var ra *RetryAfterError
	if errors.As(err, &ra) && ra.After > d {
		d = min(ra.After, policy.Cap)
	}
	return d
}

// fault returns a server fault with the engine's code and the operator's cause.
func fault(code, step, cause string) *PermanentError {
	return &PermanentError{Code: code, Message: serverFaultMessage, Cause: cause, Step: step, Fault: true}
}

// stored returns a copy of e whose texts PostgreSQL's jsonb can keep (see
// store.Text), to be marshalled into the operation's row.
func (e *PermanentError) stored() *PermanentError {
	c := *e
	c.Code, c.Message, c.Cause, c.Step = store.Text(e.Code), store.Text(e.Message), store.Text(e.Cause), store.Text(e.Step)
	c.err = nil // not stored
	return &c
}

// Error implements error. It is the operator's text: the cause when there is one.
func (e *PermanentError) Error() string {
	text := e.Message
	if e.Cause != "" {
		text = e.Cause
	}
	if e.Step != "" {
		return fmt.Sprintf("step %s: %s: %s", e.Step, e.Code, text)
	}
	return e.Code + ": " + text
}

// ServerFault reports whether the error is a server fault rather than a
// business answer: what an HTTP layer answers 500 for, with a fixed message.
// Errors stored by older versions, which had no Fault field, are judged by the
// engine's codes.
func (e *PermanentError) ServerFault() bool {
	if e.Fault {
		return true
	}
	switch e.Code {
	case CodeAttemptsExhausted, CodeCompensationFailed, CodeResultFailed, CodePermanent,
		CodeUnreadableError, CodeDefinitionChanged, "step_failed", "":
		return true
	}
	return false
}

// Unwrap returns the error that Permanent wrapped, if any.
func (e *PermanentError) Unwrap() error { return e.err }

// Is reports whether target is a *PermanentError with the same Code, so that
// errors.Is(err, engine.Fail("declined", "")) matches on the code alone.
func (e *PermanentError) Is(target error) bool {
	t, ok := target.(*PermanentError)
	return ok && t.Code == e.Code
}

// HaltError stops an operation where it is: it stays in progress, needing
// attention with this code and message, and no run takes it up again, nothing
// is retried and nothing compensated, until an operator retries it
// (Engine.Reopen) or cancels it (Engine.Cancel, which refuses past the point of
// no return). Make one with Halt.
type HaltError struct {
	// Code is a short machine-readable reason, such as "provider_mismatch".
	Code string
	// Message is for operators.
	Message string
}

// Halt returns a HaltError: what a step returns when it finds something that
// neither a retry nor a compensation may act on, such as a provider's answer
// that does not match the request (a success for another amount is no success,
// and nothing may be undone on a guess).
func Halt(code, message string) *HaltError {
	return &HaltError{Code: code, Message: message}
}

// Error implements error.
func (e *HaltError) Error() string { return "halt: " + e.Code + ": " + e.Message }

// KeyReusedError is the error of a Start whose idempotency key an operation
// holds that was started with another input. errors.Is(err, ErrKeyReused)
// matches it.
type KeyReusedError struct {
	// ID is the operation that holds the key.
	ID uuid.UUID
	// Fields are the names that differ, sorted: top-level fields of the input
	// (or those of the caller's Fingerprint), and context names (such as an HTTP
	// request's "method" and "path").
	Fields []string
}

// Error implements error.
func (e *KeyReusedError) Error() string {
	return fmt.Sprintf("engine: %s: operation %s holds the key; fields that differ: %s",
		ErrKeyReused, e.ID, strings.Join(e.Fields, ", "))
}

// Is reports whether target is ErrKeyReused.
func (e *KeyReusedError) Is(target error) bool { return target == ErrKeyReused }

// panicError is a panic of user code, recovered into a failed attempt.
type panicError struct {
	value any
	stack string
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v\n%s", e.value, e.stack) }

// protect calls fn and turns a panic in it into a *panicError, so that a step,
// a lookup, a compensation or a result function that panics fails its attempt
// instead of the process.
func protect(fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: shortStack(debug.Stack())}
		}
	}()
	return fn()
}

// shortStack keeps the frames of a stack from debug.Stack that matter: those
// below the panic, at most 16 lines of them.
func shortStack(stack []byte) string {
	lines := strings.Split(strings.TrimSpace(string(stack)), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "panic(") {
			lines = lines[i+2:] // the frame of panic itself, and its file line
			break
		}
	}
	if len(lines) > 16 {
		lines = lines[:16]
	}
	return strings.Join(lines, "\n")
}

// publicText returns what a client may be told of a failed attempt: a
// PermanentError's message, "panic: ..." for a panic, and a fixed text for any
// other error, whose own text (SQL, URLs, Go errors) is for operators only.
func publicText(step string, err error) string {
	var pe *PermanentError
	var pan *panicError
	var halt *HaltError
	switch {
	case errors.As(err, &pe):
		return pe.Message
	case errors.As(err, &halt):
		return fmt.Sprintf("step %s stopped; the operation waits for an operator", step)
	case errors.As(err, &pan):
		return fmt.Sprintf("panic: step %s crashed; it is retried", step)
	case IsUnavailable(err):
		return fmt.Sprintf("step %s could not reach the database, which was unavailable; it is retried", step)
	}
	return fmt.Sprintf("step %s failed temporarily; it is retried", step)
}

// VersionError says why a process cannot run an operation: its definition of the
// operation's type lacks a step that the operation still needs. The operation
// waits, needing attention (CodeDefinitionChanged), for a process that has it.
type VersionError struct {
	Operation string
	// Started is the step list the operation was started with.
	Started []string
	// Registered is the step list of this process's definition.
	Registered []string
	// Missing are the steps the operation still needs that Registered lacks.
	Missing []string
}

// Error implements error.
func (e *VersionError) Error() string {
	return fmt.Sprintf("operation %s was started with steps %q, but this process defines %q: missing %q",
		e.Operation, e.Started, e.Registered, e.Missing)
}

// lockNotAvailable reports whether err is PostgreSQL's lock_not_available
// (55P03): a statement that waited out lock_timeout, and did nothing.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
