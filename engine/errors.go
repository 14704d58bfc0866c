package engine

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
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
	// ErrRunning is returned by Cancel for an operation that a live run holds.
	ErrRunning = errors.New("operation is running")
	// ErrNotFailed is returned by Retry for an operation that has not failed.
	ErrNotFailed = errors.New("operation has not failed")
	// ErrFinished is returned by Cancel for an operation that has finished.
	ErrFinished = errors.New("operation has finished")
)

// The codes of the failures that the engine itself ends operations with.
const (
	// CodeAttemptsExhausted: a step failed transiently more often than its retry
	// policy allows.
	CodeAttemptsExhausted = "attempts_exhausted"
	// CodeCompensationFailed: a compensation failed for good.
	CodeCompensationFailed = "compensation_failed"
	// CodeResultFailed: the operation's result function returned an error.
	CodeResultFailed = "result_failed"
	// CodeDefinitionChanged: this process's definition lacks a step that the
	// operation still needs (see VersionError).
	CodeDefinitionChanged = "definition_changed"
	// CodeCancelled: an operator cancelled the operation (Engine.Cancel).
	CodeCancelled = "cancelled"
	// CodeUnreadableError: the stored error could not be decoded.
	CodeUnreadableError = "unreadable_error"
)

// PermanentError is a failure that no retry can mend: the engine does not try the
// step again, runs the compensations of the steps that succeeded, and ends the
// operation failed with this error recorded. Make one with Fail or Permanent.
//
// Code and Message are stored with the operation and read back by Info.Error, so
// they are what a replay of the operation reports.
type PermanentError struct {
	// Code is a short machine-readable reason, such as "amount_exceeds_refundable".
	Code string `json:"code"`
	// Message is for a person.
	Message string `json:"message"`
	// Details are optional JSON details stored with the error.
	Details json.RawMessage `json:"details,omitempty"`
	// Step names the step that failed. The engine fills it in.
	Step string `json:"step,omitempty"`

	err error
}

// Fail returns a PermanentError with the given code and message.
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

// Permanent marks err as permanent, with the code "permanent". A nil err gives nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return err
	}
	return &PermanentError{Code: "permanent", Message: err.Error(), err: err}
}

// Error implements error.
func (e *PermanentError) Error() string {
	if e.Step != "" {
		return fmt.Sprintf("step %s: %s: %s", e.Step, e.Code, e.Message)
	}
	return e.Code + ": " + e.Message
}

// Unwrap returns the error that Permanent wrapped, if any.
func (e *PermanentError) Unwrap() error { return e.err }

// Is reports whether target is a *PermanentError with the same Code, so that
// errors.Is(err, engine.Fail("declined", "")) matches on the code alone.
func (e *PermanentError) Is(target error) bool {
	t, ok := target.(*PermanentError)
	return ok && t.Code == e.Code
}

// VersionError fails an operation that needs a step that this process's definition
// of its type no longer has.
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
