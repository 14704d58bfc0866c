package refund_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/fakeprovider"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// setupProvider serves the fake provider on a database of its own and returns a
// client of it.
func setupProvider(t *testing.T) *refund.ProviderClient {
	t.Helper()
	pool := testdb.Pool(t)
	require.NoError(t, fakeprovider.Migrate(t.Context(), pool))
	srv, err := fakeprovider.New(pool, nil)
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &refund.ProviderClient{BaseURL: ts.URL + "/"}
}

func TestProviderClient(t *testing.T) {
	t.Parallel()

	t.Run("RefundAndByKey", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		_, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.False(t, found)

		ref, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.NotEmpty(t, ref.ID)
		again, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.Equal(t, ref.ID, again.ID)

		got, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, &refund.ProviderRefund{ID: ref.ID, OrderID: "A-1", Amount: 100}, got)
	})

	t.Run("DeclineMatchesErrProviderDeclined", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: fakeprovider.DeclinePrefix + "1", Amount: 100})
		require.ErrorIs(t, err, refund.ErrProviderDeclined)
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusPaymentRequired, pe.StatusCode)
		require.Equal(t, "declined", pe.Code)
	})

	t.Run("ErrorAnswersAreNotDeclines", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, c.BaseURL+"faults", strings.NewReader(`{"mode": "error"}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusNoContent, resp.StatusCode)

		_, err = c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusServiceUnavailable, pe.StatusCode)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))

		_, err = c.Refund(t.Context(), "", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadRequest, pe.StatusCode)
		require.Equal(t, "idempotency_key_missing", pe.Code)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))
	})

	t.Run("UnreachableIsNotADecline", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.NotFoundHandler())
		ts.Close()
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.Error(t, err)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))
		_, _, err = c.ByKey(t.Context(), "key-1")
		require.Error(t, err)
	})

	// A 404 that is not the provider's own "no refund under this key" (a wrong
	// base URL, a proxy's page) is an error, never "not made": a lookup that
	// took it for one would let the ledger move be undone although the
	// provider refunded.
	t.Run("NotFoundFromSomethingElseIsNoAnswer", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(ts.Close)
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, found, err := c.ByKey(t.Context(), "key-1")
		require.Error(t, err)
		require.False(t, found)
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusNotFound, pe.StatusCode)
	})

	t.Run("NonJSONErrorAnswer", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}))
		t.Cleanup(ts.Close)
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadGateway, pe.StatusCode)
		require.Equal(t, "bad gateway", pe.Message)
	})
}
