package fakeprovider_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/workflows/refund"
)

// TestProviderClient runs the refund workflow's client (refund.ProviderClient),
// which the demo calls the provider with, against the provider: the refund
// workflow's own tests serve a provider of their own, which speaks the same
// API from memory.
func TestProviderClient(t *testing.T) {
	t.Parallel()

	t.Run("RefundAndByKey", func(t *testing.T) {
		t.Parallel()
		c := &refund.ProviderClient{BaseURL: setup(t).url + "/"}
		_, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.False(t, found, "the provider's 404 is \"none made\"")

		ref, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.Equal(t, refund.ProviderStatusSucceeded, ref.Status)
		again, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.Equal(t, ref.ID, again.ID)

		got, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, &refund.ProviderRefund{ID: ref.ID, OrderID: "A-1", Amount: 100, Status: refund.ProviderStatusSucceeded}, got)
	})

	t.Run("PendingRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := &refund.ProviderClient{BaseURL: b.url}
		b.fault(t, `{"mode": "pending", "delayMs": 600000}`)
		ref, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.NoError(t, err)
		require.Equal(t, refund.ProviderStatusPending, ref.Status)
		got, found, err := c.ByKey(t.Context(), "key-1")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, refund.ProviderStatusPending, got.Status)
	})

	t.Run("DeclineMatchesErrProviderDeclined", func(t *testing.T) {
		t.Parallel()
		c := &refund.ProviderClient{BaseURL: setup(t).url}
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: fakeprovider.DeclinePrefix + "1", Amount: 100})
		require.ErrorIs(t, err, refund.ErrProviderDeclined)
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusPaymentRequired, pe.StatusCode)
		require.EqualValues(t, "declined", pe.Code)
	})

	t.Run("ErrorAnswersAreNotDeclines", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := &refund.ProviderClient{BaseURL: b.url}
		b.fault(t, `{"mode": "error"}`)
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusServiceUnavailable, pe.StatusCode)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))

		_, err = c.Refund(t.Context(), "", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadRequest, pe.StatusCode)
		require.EqualValues(t, "idempotency_key_missing", pe.Code)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))
	})
}
