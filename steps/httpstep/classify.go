package httpstep

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemflow/idemflow/engine"
)

// StatusError is an answer that is no success, as an error: what Classify
// returns for a transient status (wrapped by engine.RetryAfter when the answer
// has a Retry-After), and Find for an answer that is neither the call found
// nor the call not made.
type StatusError struct {
	// Method and URL are the request's.
	Method string
	URL    string
	// StatusCode is the answer's HTTP status.
	StatusCode int
	// Code and Message are from the answer's error body (see
	// Answer.ErrorBody); without one, Code is empty and Message holds the start
	// of the body.
	Code    string
	Message string
}

// NewStatusError returns a's status, and what its body says, as an error.
func NewStatusError(a Answer) *StatusError {
	code, msg := a.ErrorBody()
	if code == "" && msg == "" {
		msg = text(strings.TrimSpace(string(a.Body)))
	}
	return &StatusError{Method: a.Method, URL: a.URL, StatusCode: a.StatusCode, Code: code, Message: msg}
}

// Error implements error. It is for operators: it names the URL.
func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s answered %d", e.Method, e.URL, e.StatusCode)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Classify is the default ClassifyFunc, for a service with Stripe's
// conventions:
//
//   - 2xx is a success (nil).
//   - 4xx but 408, 409, 425 and 429 is the service's refusal, which no retry
//     changes: engine.Fail with the code and message of the answer's error body
//     (see Answer.ErrorBody), else the code "http_<status>" and a message that
//     names the status. The error's Cause, for operators, names the URL.
//   - Every other answer (5xx; 408, 409, 425 and 429, which say "not now"; a
//     3xx, which the default client does not follow) is a transient
//     *StatusError, with the answer's Retry-After (seconds or an HTTP date) as
//     the least delay before the next attempt (engine.RetryAfter).
//
// A ClassifyFunc that knows the service better can wrap it:
//
//	func(a httpstep.Answer) error {
//		if a.StatusCode == http.StatusPaymentRequired {
//			return engine.Fail("payment_declined", "the payment was declined")
//		}
//		return httpstep.Classify(a)
//	}
//
// A refusal with the code CodeKeyReused halts the operation instead
// (engine.Halt): the service holds another request under the derived key, which
// may have been carried out, so undoing the steps before it would be a guess.
func Classify(a Answer) error {
	if a.Success() {
		return nil
	}
	if a.StatusCode >= 400 && a.StatusCode <= 499 && !notNow(a.StatusCode) {
		code, msg := a.ErrorBody()
		if !validCode(code) {
			code = "http_" + strconv.Itoa(a.StatusCode)
		}
		if msg == "" {
			msg = strings.TrimSpace(fmt.Sprintf("the service refused the request (%d %s", a.StatusCode, http.StatusText(a.StatusCode))) + ")"
		}
		if code == CodeKeyReused {
			// The key was used before with another request, which may have
			// been carried out: nothing says this one was not, so nothing may
			// be undone on this answer. An operator decides.
			return engine.Halt(code, "the service says this idempotency key was used for another request: "+msg)
		}
		pe := engine.Fail(code, msg)
		pe.Cause = NewStatusError(a).Error()
		return pe
	}
	return transient(a)
}

// notNow reports whether a 4xx status says "not now" rather than "never":
// 408 Request Timeout, 409 Conflict (Stripe's answer to a request whose key
// another request holds), 425 Too Early and 429 Too Many Requests.
func notNow(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return true
	}
	return false
}

// transient returns a as a transient failure, with its Retry-After.
func transient(a Answer) error {
	err := error(NewStatusError(a))
	if d, ok := retryAfter(a.Header.Get("Retry-After"), time.Now()); ok {
		err = engine.RetryAfter(err, d)
	}
	return err
}

// maxRetryAfter bounds a Retry-After in seconds before it becomes a Duration
// (the engine bounds the delay by the retry policy's Cap anyway).
const maxRetryAfter = 366 * 24 * time.Hour

// retryAfter parses the value of a Retry-After header, a number of seconds or
// an HTTP date, at now. It returns false for a value that is empty, not either,
// or no later than now.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if strings.Trim(v, "0123456789") == "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil || secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter, true // all digits: out of range
		}
		d := time.Duration(secs) * time.Second
		return d, d > 0
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := min(t.Sub(now), maxRetryAfter)
	return d, d > 0
}

// ErrorBody returns the code and message of the answer's error body, in
// either of the usual shapes, {"code": ..., "message": ...} and {"error":
// {"code": ..., "message": ...}} (the nested one first). Either is empty when
// the body does not have it as a string; a message is cut to 300 bytes and
// made valid UTF-8.
func (a Answer) ErrorBody() (code, message string) {
	type fields struct {
		Code    json.RawMessage `json:"code"`
		Message json.RawMessage `json:"message"`
	}
	var body struct {
		fields
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(a.Body, &body) != nil {
		return "", ""
	}
	var nested fields
	if json.Unmarshal(body.Error, &nested) == nil && (str(nested.Code) != "" || str(nested.Message) != "") {
		return str(nested.Code), text(str(nested.Message))
	}
	return str(body.Code), text(str(body.Message))
}

// HasCode returns a function that reports whether an answer's error body has
// the code code: a Lookup.NotFoundFunc for a service whose "no call under this
// key" is a 404 with its own code, such as HasCode("refund_not_found").
func HasCode(code string) func(Answer) bool {
	return func(a Answer) bool {
		c, _ := a.ErrorBody()
		return c == code
	}
}

// AnyNotFound is a Lookup.NotFoundFunc that takes every 404 as the service's
// "no call under this key", for a service whose 404 says nothing more. A 404
// from a wrong URL or a proxy then reads as "not made" too, and lets the
// engine undo the steps before the call although it may have gone through:
// prefer HasCode when the service sends a code.
func AnyNotFound(Answer) bool { return true }

// str returns the string that raw holds, or "" when it holds none.
func str(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// maxText bounds a message taken from an answer.
const maxText = 300

// text returns s cut to maxText bytes, never in the middle of a character, and
// made valid UTF-8: it may be stored as a step's error.
func text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxText {
		return s
	}
	cut := maxText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// validCode reports whether code can be a PermanentError's code: 1 to 64
// letters, digits and "_.-:".
func validCode(code string) bool {
	if code == "" || len(code) > 64 {
		return false
	}
	for _, r := range code {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.', r == '-', r == ':':
		default:
			return false
		}
	}
	return true
}

// CodeKeyReused is the code with which services (Stripe, and the fakes of
// idemflowtest/fakeservice) refuse a request whose idempotency key another
// request holds: Classify halts the operation on it.
const CodeKeyReused = "idempotency_key_reused"
