package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/store"
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
	Code FailureCode `json:"code"`
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
	return &PermanentError{Code: FailureCode(code), Message: message}
}

// failCode is the SQLSTATE that idemflow_fail raises.
const failCode = "IF002"

// fromSQL returns err as a PermanentError when it is, or wraps, the error of
// idemflow_fail, and err itself otherwise.
func fromSQL(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == failCode {
		return &PermanentError{Code: FailureCode(pgErr.Detail), Message: pgErr.Message, err: err}
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

// Accepted returns an error that says an external call has no final outcome
// yet. An external step returns it when the outside service accepted the call
// and settles it later (a pending refund, an ACH payout): the step waits, and
// the operation with it, with no run holding it, until its lookup finds the
// outcome final, the outside service's word arrives (Engine.RecordOutcome) or
// an operator decides. reference, when not empty, is the service's id of what
// it will carry out: the step keeps it, and an outcome that names another
// reference is not the step's. A lookup returns it (reference empty) when the
// service has the call but is still processing it. reason is for operators.
func Accepted(reference, reason string) error {
	err := fmt.Errorf("%w: %s", errAccepted, reason)
	if reference == "" {
		return err
	}
	return &pendingError{reference: reference, err: err}
}

// pendingError is Accepted's error.
type pendingError struct {
	reference string
	err       error
}

func (e *pendingError) Error() string { return e.err.Error() }
func (e *pendingError) Unwrap() error { return e.err }

// pendingReference is the reference that err, from Accepted, names.
func pendingReference(err error) string {
	var pe *pendingError
	if errors.As(err, &pe) {
		return pe.reference
	}
	return ""
}

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
func fault(code FailureCode, step, cause string) *PermanentError {
	return &PermanentError{Code: code, Message: serverFaultMessage, Cause: cause, Step: step, Fault: true}
}

// stored returns a copy of e whose texts PostgreSQL's jsonb can keep (see
// store.Text), to be marshalled into the operation's row.
func (e *PermanentError) stored() *PermanentError {
	c := *e
	c.Code, c.Message, c.Cause, c.Step = FailureCode(store.Text(string(e.Code))), store.Text(e.Message), store.Text(e.Cause), store.Text(e.Step)
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
	return string(e.Code) + ": " + text
}

// ServerFault reports whether the error is a server fault rather than a
// business answer: what an HTTP layer answers 500 for, with a fixed message.
func (e *PermanentError) ServerFault() bool {
	if e.Fault {
		return true
	}
	// An error stored without Fault (by a build before it existed) is judged
	// by the engine's codes.
	switch string(e.Code) {
	case string(CodeAttemptsExhausted), string(CodeCompensationFailed), string(CodeResultFailed), string(CodePermanent),
		string(CodeUnreadableError), string(CodeDefinitionChanged), codeStepFailed, "":
		return true
	}
	return false
}

// codeStepFailed is the code of the failure of a step whose own error was not
// stored, as a resume rebuilds it from the step's row.
const codeStepFailed = "step_failed"

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
// (Engine.Retry) or cancels it (Engine.Cancel, which refuses past the point of
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
