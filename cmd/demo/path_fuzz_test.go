package main

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/demoapi"
	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// newInProcessServer returns the demo's HTTP handler, as serveAPI builds it, on a
// database of its own with the demo's migrations, and a fake provider served by
// an httptest server. Its engine runs first attempts; no worker is started.
func newInProcessServer(tb testing.TB) http.Handler {
	tb.Helper()
	ctx := tb.Context()
	pool := testdb.Pool(tb)
	logger := slog.New(slog.DiscardHandler)
	require.NoError(tb, migrate(ctx, pool, logger))
	p, err := fakeprovider.New(pool, &fakeprovider.Config{Logger: logger})
	require.NoError(tb, err)
	providerServer := httptest.NewServer(p.Handler())
	tb.Cleanup(providerServer.Close)
	wf, err := refund.New(&refund.ProviderClient{BaseURL: providerServer.URL}, nil)
	require.NoError(tb, err)
	e, err := engine.New(pool, &engine.Config{Operations: wf.Operations(), Logger: logger})
	require.NoError(tb, err)
	srv, err := demoapi.New(&demoapi.Config{
		Pool: pool, Engine: e, Workflows: wf, Clients: apiClients(defaultClients),
		Wait: 5 * time.Second, Provider: p.Handler(), Logger: logger,
	})
	require.NoError(tb, err)
	return srv
}

// serveInProcess serves req with h, as merchant-a, and returns the recorded answer.
func serveInProcess(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	req.Header.Set("Authorization", "Bearer "+tokenA)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// pathIDPrefixes are the routes that take an id from the path.
var pathIDPrefixes = []string{"/orders/", "/refunds/", "/operations/", "/provider/refunds/by-key/"}

// FuzzPathID sends arbitrary ids, taken raw from the path, to every route that
// reads one (GET /orders/{orderId}, /refunds/{refundId}, /operations/{operationId}
// and the provider's /provider/refunds/by-key/{key}), through the demo's handler
// with a real engine and database: escaped as a client sends them, and as
// written when that makes a request line net/http accepts. The answer is never a
// 5xx, and every 4xx is a JSON error.
func FuzzPathID(f *testing.F) {
	h := newInProcessServer(f)

	// An order, a refund and their operations, so that some ids are found.
	create := func(path, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(f.Context(), http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", newKey())
		rec := serveInProcess(h, req)
		require.Equal(f, http.StatusCreated, rec.Code, "body %s", rec.Body)
		return rec
	}
	o := create("/orders", `{"orderId": "A-1042", "customerId": "cus_1", "amount": 5000}`)
	r := create("/refunds", `{"orderId": "A-1042", "amount": 1499}`)
	var ref refundBody
	require.NoError(f, json.Unmarshal(r.Body.Bytes(), &ref))

	for _, seed := range []string{
		"A-1042", ref.RefundID, o.Header().Get("Operation-Id"), r.Header().Get("Operation-Id"),
		"idf1_1ct08ZTf4a47mqfGWnA7UZHi5sZELuadC4rZKleEiLo", "idf2_ZZGPyTIDrLHK-dgrZMoLAXWEtJnl-hWdC4rGrempfW4",
		"", " ", ".", "..", "../accounts", "..%2F..%2Faccounts", "a/b", "/", "%2F", "%", "%zz", "%00",
		"\x00", "a\x00b", "\xff", "\xed\xa0\x80", "\xc0\xaf", "\x7f", "\r\n", "\t", "é", "💩",
		"?x=1", "#frag", "' OR 1=1--", "re_", "pr_", "00000000-0000-0000-0000-000000000000",
		"{9b2c0d3e-1f4a-4b5c-8d6e-7f8091a2b3c4}", "urn:uuid:9b2c0d3e-1f4a-4b5c-8d6e-7f8091a2b3c4",
		strings.Repeat("x", 255), strings.Repeat("x", 256), strings.Repeat("x", 10000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		for _, prefix := range pathIDPrefixes {
			req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, prefix+url.PathEscape(id), nil)
			requireNoServerError(t, serveInProcess(h, req), prefix+url.PathEscape(id))

			raw := "GET " + prefix + id + " HTTP/1.1\r\nHost: demo\r\n\r\n"
			req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
			if err != nil {
				continue // net/http answers 400 itself
			}
			requireNoServerError(t, serveInProcess(h, req.WithContext(t.Context())), prefix+id)
		}
	})
}

// requireNoServerError requires an answer below 500, and a JSON error for a 4xx.
func requireNoServerError(t *testing.T, rec *httptest.ResponseRecorder, path string) {
	t.Helper()
	require.Less(t, rec.Code, 500, "GET %q: %s", path, rec.Body)
	if rec.Code >= 400 {
		require.Equal(t, "application/json", rec.Header().Get("Content-Type"), "GET %q", path)
		var body struct {
			Error *apiError `json:"error"`
		}
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), "GET %q: %s", path, rec.Body)
		require.NotNil(t, body.Error, "GET %q: %s", path, rec.Body)
		require.NotEmpty(t, body.Error.Code, "GET %q: %s", path, rec.Body)
	}
}
