package main

import (
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDeepNestingIsCheap sends a body of nested arrays in metadata to POST
// /orders. Before idempotency bounded the nesting (idempotency.MaxDepth), each
// level kept its own path alive down the recursion, so a body nested n deep
// allocated about 1.5·n² bytes before it was refused: one 64 KiB body took 6.4 GB
// of memory and 18 s of CPU in the demo. The cost of refusing a body must be
// linear in its size.
//
// The test nests 20,000 deep (40 KB) and measures the bytes that the handler
// allocates (runtime.MemStats.TotalAlloc), not time; it allows 1,000 times the
// body's size.
func TestDeepNestingIsCheap(t *testing.T) {
	h := newInProcessServer(t)
	const depth = 20000
	body := `{"orderId": "A-1", "customerId": "cus_1", "amount": 10, "metadata": {"x": ` +
		strings.Repeat("[", depth) + strings.Repeat("]", depth) + "}}"
	req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", newKey())

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rec := serveInProcess(h, req)
	runtime.ReadMemStats(&after)

	require.EqualValues(t, http.StatusBadRequest, rec.Code, "body %s", rec.Body)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("a body of %d bytes nested %d deep allocated %d MB", len(body), depth, allocated>>20)
	require.Less(t, allocated, uint64(1000*len(body)), "bytes allocated to refuse one body of %d bytes", len(body))
}
