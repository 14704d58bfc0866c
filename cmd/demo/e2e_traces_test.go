package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestTracesExported: with OTEL_EXPORTER_OTLP_ENDPOINT set, the demo exports
// its traces over OTLP/HTTP (flushed at shutdown at the latest).
func TestTracesExported(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var posts, bytes int
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			mu.Lock()
			posts++
			bytes += len(body)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)

	d := startDemo(t, testdb.URL(t), &demoOpts{env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_SERVICE_NAME=idemflow-demo"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	requireStatus(t, c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100}), http.StatusCreated)
	d.stop()
	mu.Lock()
	defer mu.Unlock()
	require.Positive(t, posts, "no spans reached the collector")
	require.Greater(t, bytes, 200)
}
