package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestMaxInFlightPerClient: with -max-in-flight-per-client 1, a client whose
// refund is still running gets 429 too_many_requests for its next one, with
// Retry-After and its key free, while the other client is served.
func TestMaxInFlightPerClient(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-max-in-flight-per-client", "1", "-wait", "200ms"}})
	a, b := d.client(t, tokenA), d.client(t, tokenB)
	a.createOrder("A-1", "cus_1", 5000)
	b.createOrder("B-1", "cus_2", 5000)
	a.setFault("slow", 1, 3000) // a's first refund stays in flight

	first := a.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100})
	requireStatus(t, first, http.StatusAccepted)
	key := newKey()
	busy := a.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 200})
	requireError(t, busy, http.StatusTooManyRequests, "too_many_requests")
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	served := b.post("/refunds", newKey(), map[string]any{"orderId": "B-1", "amount": 300})
	requireStatus(t, served, http.StatusCreated)

	// Once its refund ended, the refused key is served: it was never taken.
	require.Eventually(t, func() bool {
		r := a.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 200})
		return r.status == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond)
	d.stop()
}
