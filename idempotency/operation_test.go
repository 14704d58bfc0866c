package idempotency_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

// TestOperationHandler: a client reads the operations it started, and only
// those, in the shape OperationJSON gives.
func TestOperationHandler(t *testing.T) {
	t.Parallel()
	h := setup(t, harnessOpts{})
	ok := h.do(t, request{body: `{"account":"acct-1","amount":500}`, keys: []string{"k-ok"}})
	require.Equal(t, http.StatusCreated, ok.status, string(ok.body))
	declined := h.do(t, request{body: `{"account":"declined","amount":500}`, keys: []string{"k-declined"}})
	require.Equal(t, http.StatusPaymentRequired, declined.status, string(declined.body))

	read, err := idempotency.OperationHandler(&idempotency.Config{Engine: h.e, ScopeFunc: bearerScope}, nil)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("GET /operations/{operationId}", read)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	get := func(id, token string) (int, http.Header, []byte) {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/operations/"+id, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, "application/json", res.Header.Get("Content-Type"))
		return res.StatusCode, res.Header, body
	}

	id := ok.header.Get(idempotency.HeaderOperationID)
	status, header, body := get(id, "client-a")
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, id, header.Get(idempotency.HeaderOperationID))
	var op idempotency.OperationJSON
	require.NoError(t, json.Unmarshal(body, &op))
	require.Equal(t, "charge", op.Name)
	require.Equal(t, "k-ok", op.Key)
	require.Equal(t, string(engine.StatusSucceeded), op.Status)
	require.False(t, op.NeedsAttention)
	require.NotNil(t, op.FinishedAt)
	require.Len(t, op.Steps, 2)
	require.Equal(t, "record", op.Steps[0].Name)
	require.Empty(t, op.Steps[0].DerivedKey, "a transactional step sends no key")
	require.Equal(t, "settle", op.Steps[1].Name)
	require.Equal(t, string(engine.StepStatusSucceeded), op.Steps[1].Status)
	require.Regexp(t, `^idf3_`, op.Steps[1].DerivedKey)
	require.Equal(t, string(engine.ResolvedByCall), op.Steps[1].ResolvedBy)

	status, _, body = get(declined.header.Get(idempotency.HeaderOperationID), "client-a")
	require.Equal(t, http.StatusOK, status)
	require.NoError(t, json.Unmarshal(body, &op))
	require.Equal(t, string(engine.StatusFailed), op.Status)
	require.NotNil(t, op.Steps[1].LastError, "the client's text of the failure")

	for name, c := range map[string]struct {
		id, token string
		status    int
		code      string
	}{
		"another client's": {id, "client-b", http.StatusNotFound, idempotency.CodeOperationNotFound},
		"unknown":          {"0193a6f0-0000-7000-8000-000000000001", "client-a", http.StatusNotFound, idempotency.CodeOperationNotFound},
		"malformed":        {"not-an-id", "client-a", http.StatusNotFound, idempotency.CodeOperationNotFound},
		"unauthenticated":  {id, "", http.StatusUnauthorized, idempotency.CodeUnauthenticated},
	} {
		status, _, body := get(c.id, c.token)
		require.Equal(t, c.status, status, name)
		require.EqualValues(t, c.code, decodeError(t, body).Error.Code, name)
	}

	_, err = idempotency.OperationHandler(&idempotency.Config{Engine: h.e}, nil)
	require.Error(t, err, "no scope function")
}

// TestScopeBusy: a client with its share of operations in flight is answered
// 429 too_many_requests with Retry-After and its key stays free; another
// client is served.
func TestScopeBusy(t *testing.T) {
	t.Parallel()
	h := setup(t, harnessOpts{perScope: 1, wait: 50 * time.Millisecond})
	first := h.do(t, request{body: `{"account":"blocked","amount":100}`, keys: []string{"k-1"}})
	require.Equal(t, http.StatusAccepted, first.status, string(first.body))

	busy := h.do(t, request{body: `{"account":"acct-1","amount":5}`, keys: []string{"k-2"}})
	require.Equal(t, http.StatusTooManyRequests, busy.status, string(busy.body))
	require.EqualValues(t, idempotency.CodeTooManyRequests, decodeError(t, busy.body).Error.Code)
	require.NotEmpty(t, busy.header.Get("Retry-After"))
	_, err := h.e.GetByKey(t.Context(), "client-a", "k-2")
	require.ErrorIs(t, err, engine.ErrNotFound, "no key consumed")

	other := h.do(t, request{body: `{"account":"acct-1","amount":5}`, keys: []string{"k-2"}, scope: "client-b"})
	require.Equal(t, http.StatusCreated, other.status, string(other.body))

	h.release()
	require.Eventually(t, func() bool {
		res := h.do(t, request{body: `{"account":"acct-1","amount":5}`, keys: []string{"k-2"}})
		return res.status == http.StatusCreated
	}, 10*time.Second, 20*time.Millisecond, "served once its share is free")
}
