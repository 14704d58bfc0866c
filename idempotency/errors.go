package idempotency

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"time"
)

// The error codes this package answers with.
const (
	CodeUnauthenticated    = "unauthenticated"
	CodeKeyMissing         = "idempotency_key_missing"
	CodeKeyInvalid         = "idempotency_key_invalid"
	CodeKeyReused          = "idempotency_key_reused"
	CodeInvalidRequest     = "invalid_request"
	CodeRequestTooLarge    = "request_too_large"
	CodeRequestInProgress  = "request_in_progress"
	CodeInternalError      = "internal_error"
	CodeServiceUnavailable = "service_unavailable"
	// CodeOverloaded answers a request that this process has no room to run
	// (engine.ErrOverloaded): 503 with Retry-After, no key consumed.
	CodeOverloaded = "overloaded"
	// CodeTooManyRequests answers a request of a client that has its share of
	// the operations in flight (engine.ErrScopeBusy): 429 with Retry-After, no
	// key consumed.
	CodeTooManyRequests = "too_many_requests"
	// CodeOperationFailed answers an operation that ended with a server fault
	// (engine.PermanentError.ServerFault), with a fixed message: 500.
	CodeOperationFailed = "operation_failed"
	// CodeOperationNotFound answers a read of an operation that is not the
	// client's, or none (OperationHandler): 404.
	CodeOperationNotFound = "operation_not_found"
)

// FieldError is a problem with one field of a request body. A DecodeFunc returns
// one to answer 400 invalid_request with error.param set to Param.
type FieldError struct {
	// Param names the field: a top-level field's name, or a path into it such as
	// "metadata.note" or "items[2]".
	Param string
	// Message says what is wrong, for a person.
	Message string
}

// Error implements error.
func (e *FieldError) Error() string { return e.Param + ": " + e.Message }

// WriteError answers status with the JSON error body
//
//	{"error": {"code": code, "message": message, ...extra}}
//
// and Content-Type application/json. The members of extra follow message, in key
// order; an extra member that does not marshal to JSON is left out. Equal
// arguments give byte-identical bodies.
func WriteError(w http.ResponseWriter, status int, code, message string, extra map[string]any) {
	writeJSON(w, status, errorBody(code, message, extra))
}

// RefuseBody prepares an answer that refuses a request without reading its
// body (a 401, a 404, a 405): the connection closes after it (Connection:
// close), and the server stops reading at once rather than wait, up to its read
// timeout, for a body that the client may never finish, so that such clients
// cannot hold connections. (net/http still leaves the client half a second to
// read the answer before it closes the connection.)
func RefuseBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func errorBody(code, message string, extra map[string]any) []byte {
	var b bytes.Buffer
	b.WriteString(`{"error":{"code":`)
	writeString(&b, code)
	b.WriteString(`,"message":`)
	writeString(&b, message)
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if k == "code" || k == "message" {
			continue
		}
		raw, err := json.Marshal(extra[k])
		if err != nil {
			continue
		}
		b.WriteByte(',')
		writeString(&b, k)
		b.WriteByte(':')
		b.Write(raw)
	}
	b.WriteString("}}")
	return b.Bytes()
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client has gone: nothing to do
}
