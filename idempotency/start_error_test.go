package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

// TestWriteStartError: the starts that reserved nothing, answered with a
// status, a code and Retry-After; any other error is left to the caller.
func TestWriteStartError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"Overloaded", engine.ErrOverloaded, http.StatusServiceUnavailable, idempotency.CodeOverloaded},
		{"ScopeBusy", engine.ErrScopeBusy, http.StatusTooManyRequests, idempotency.CodeTooManyRequests},
		{"Stopped", engine.ErrStopped, http.StatusServiceUnavailable, idempotency.CodeServiceUnavailable},
		{"Unavailable", context.DeadlineExceeded, http.StatusServiceUnavailable, idempotency.CodeServiceUnavailable},
		{"IncompatibleSchema", engine.ErrIncompatibleSchema, http.StatusServiceUnavailable, idempotency.CodeServiceUnavailable},
		{"Other", errors.New("boom"), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			written := idempotency.WriteStartError(w, fmt.Errorf("engine: start %q: %w", "refund", tc.err), 1500*time.Millisecond, "retry with the same key")
			if tc.status == 0 {
				require.False(t, written)
				require.Zero(t, w.Body.Len())
				return
			}
			require.True(t, written)
			require.EqualValues(t, tc.status, w.Code)
			require.Equal(t, "2", w.Header().Get("Retry-After"))
			var body struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &body))
			require.EqualValues(t, tc.code, body.Error.Code)
			require.Regexp(t, `; retry with the same key$`, body.Error.Message)
			require.NotContains(t, body.Error.Message, "refund", "nothing of the error's text")
		})
	}
}
