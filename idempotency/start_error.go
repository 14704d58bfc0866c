package idempotency

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// WriteStartError answers a Start that reserved nothing, because the process
// or the database could not take the operation now, as the Handler does: 503
// with CodeOverloaded (engine.ErrOverloaded), 429 with CodeTooManyRequests (a
// scope over its share: engine.ErrScopeBusy), 503 with CodeServiceUnavailable
// (the database did not answer, engine.IsUnavailable, or the engine is
// stopping, or its build is older than the database's schema:
// engine.ErrIncompatibleSchema), each with Retry-After (retryAfter, in whole seconds, at least 1).
// No key was consumed: again ends each message and tells the client how to try
// again ("retry with the same key", "deliver the event again"). For any other
// error it writes nothing and returns false: the caller's to answer.
func WriteStartError(w http.ResponseWriter, err error, retryAfter time.Duration, again string) bool {
	status, code, message := http.StatusServiceUnavailable, "", ""
	switch {
	case errors.Is(err, engine.ErrOverloaded):
		code, message = CodeOverloaded, "the server has too many operations in flight"
	case errors.Is(err, engine.ErrScopeBusy):
		// This client is over its share; the others are not: 429, not 503.
		status, code, message = http.StatusTooManyRequests, CodeTooManyRequests, "you have too many operations in flight"
	case errors.Is(err, engine.ErrStopped):
		code, message = CodeServiceUnavailable, "the server is shutting down"
	case errors.Is(err, engine.ErrIncompatibleSchema):
		code, message = CodeServiceUnavailable, "this server is older than its database and cannot serve"
	case engine.IsUnavailable(err):
		code, message = CodeServiceUnavailable, "the database is not available"
	default:
		return false
	}
	w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retryAfter), 10))
	WriteError(w, status, code, message+"; "+again, nil)
	return true
}

func retryAfterSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}
