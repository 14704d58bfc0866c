package main

// End-to-end tests of an operator's resolve: a refund whose provider step
// waits past -provider-settle while the provider cannot be asked, closed as
// made (with the provider's refund id, checked against the provider when it
// answers) or as not made, from /admin and from demo ops, with the audit
// trail.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// switchableProvider is a proxy to the provider at target that answers 503
// to everything while down.
func switchableProvider(t *testing.T, target string) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	var down atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"service_unavailable","message":"down for the test"}}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &down
}

// adminOp is GET /admin/operations/{id}'s answer, as far as these tests read it.
type adminOp struct {
	Status         string `json:"status"`
	NeedsAttention bool   `json:"needsAttention"`
	Steps          []struct {
		Name       string `json:"name"`
		Status     string `json:"status"`
		ResolvedBy string `json:"resolvedBy"`
		DerivedKey string `json:"derivedKey"`
	} `json:"steps"`
	Audit []struct {
		Action string `json:"action"`
		Actor  string `json:"actor"`
		Reason string `json:"reason"`
		Result string `json:"result"`
		Detail string `json:"detail"`
	} `json:"audit"`
}

func TestResolve(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	p := startDemo(t, dbURL, &demoOpts{provider: true})
	proxy, down := switchableProvider(t, p.base+"/provider")
	// One attempt; the lookup asked at exhaustion, just after the 1 s window
	// (which marks it needing attention), then not for 30 s: the operator's
	// turn.
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-wait", "200ms", "-max-attempts", "1", "-retry-backoff", "30s",
		"-provider-timeout", "500ms", "-provider-settle", "1s", "-provider-url", proxy.URL}})
	c := d.client(t, tokenA)
	pc := p.client(t, "")
	down.Store(true)

	// waiting refunds 700 of a new order, whose provider step waits past its
	// window, the provider unreachable; it returns the operation's id, key
	// and body.
	waiting := func(t *testing.T, orderID string) (string, string, map[string]any) {
		c := c.in(t)
		c.createOrder(orderID, "cus_"+orderID, 5000)
		key := newKey()
		body := map[string]any{"orderId": orderID, "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		op := c.awaitOperation(id, pollInterval, "needing attention", needsAttention)
		require.Equal(t, "waiting", stepOf(t, op, "provider").Status)
		return id, key, body
	}
	// resolve asks as an operator does: again, a moment later, while a live
	// process holds the operation (the waiting step's lookup may be running
	// just then: 409 held_by_live_process).
	resolve := func(t *testing.T, id, body string) *response {
		deadline := time.Now().Add(finalTimeout)
		for {
			r := d.admin(t, http.MethodPost, "/admin/operations/"+id+"/resolve", body)
			if r.status != http.StatusConflict || !strings.Contains(string(r.body), "held_by_live_process") || time.Now().After(deadline) {
				return r
			}
			time.Sleep(pollInterval)
		}
	}
	read := func(t *testing.T, id string) adminOp {
		r := d.admin(t, http.MethodGet, "/admin/operations/"+id, "")
		requireStatus(t, r, http.StatusOK)
		var op adminOp
		require.NoError(t, json.Unmarshal(r.body, &op))
		return op
	}

	t.Run("MadeCheckedAgainstTheProvider", func(t *testing.T) {
		id, key, body := waiting(t, "R-1")
		derived := stepOf(t, c.getOperation(id), "provider").DerivedKey
		// The refund landed at the provider after all; the provider answers again.
		r := pc.in(t).post("/refunds", derived, map[string]any{"orderId": "R-1", "amount": 700})
		requireStatus(t, r, http.StatusOK)
		var pr struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal(r.body, &pr))
		down.Store(false)
		defer down.Store(true)

		requireError(t, resolve(t, id, `{"outcome": "made", "providerRefundId": "pr_SOMEONEELSES", "reason": "x"}`),
			http.StatusConflict, "resolution_contradicts_provider")
		requireError(t, resolve(t, id, `{"outcome": "not_made", "reason": "x"}`), http.StatusConflict, "resolution_contradicts_provider")
		requireError(t, resolve(t, id, `{"outcome": "made", "providerRefundId": "`+pr.ID+`"}`), http.StatusBadRequest, "invalid_request")
		r = resolve(t, id, `{"outcome": "made", "providerRefundId": "`+pr.ID+`", "reason": "the provider's dashboard shows it", "actor": "dana"}`)
		requireStatus(t, r, http.StatusOK)

		final := c.postUntilFinal("/refunds", key, body)
		requireStatus(t, final, http.StatusCreated)
		require.Equal(t, pr.ID, *decodeAs[refundBody](t, final).ProviderRefundID)
		op := read(t, id)
		require.Equal(t, "operator", op.Steps[1].ResolvedBy)
		// A request refused while a run held the operation (its lookup ran
		// then) is in the trail too; resolve asked again.
		audit := op.Audit[:0]
		for _, a := range op.Audit {
			if !strings.Contains(a.Detail, "operation is running") {
				audit = append(audit, a)
			}
		}
		op.Audit = audit
		require.Len(t, op.Audit, 3)
		require.Equal(t, []string{"refused", "refused", "done"}, []string{op.Audit[0].Result, op.Audit[1].Result, op.Audit[2].Result})
		require.Equal(t, "dana", op.Audit[2].Actor)
		require.Equal(t, "admin", op.Audit[0].Actor)
		require.Equal(t, "the provider's dashboard shows it", op.Audit[2].Reason)
		requireError(t, resolve(t, id, `{"outcome": "made", "providerRefundId": "`+pr.ID+`", "reason": "again"}`), http.StatusConflict, "not_resolvable")

		// The page shows the audit trail.
		page := d.operatorRequest(t, http.MethodGet, "/ops/operations/"+id, basicAuth("ops", adminToken), "", "Accept", "text/html")
		require.Equal(t, http.StatusOK, page.status)
		require.Contains(t, string(page.body), `<table id="audit">`)
		require.Contains(t, string(page.body), "dana")
	})

	t.Run("NotMadeFromTheCommandLine", func(t *testing.T) {
		id, key, body := waiting(t, "R-2")
		// demo ops takes the server's flags: its -provider-settle is the window.
		res := demoOps(t, dbURL, "-provider-timeout", "500ms", "-provider-settle", "1s", "-actor", "erin", "resolve", id, "not-made", "the provider has no record of it")
		require.Equal(t, 0, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
		final := c.postUntilFinal("/refunds", key, body)
		requireError(t, final, http.StatusInternalServerError, "operation_failed")
		op := read(t, id)
		require.Equal(t, "failed", op.Status)
		require.Equal(t, "compensated", op.Steps[0].Status)
		last := op.Audit[len(op.Audit)-1]
		require.Equal(t, "resolve", last.Action)
		require.Equal(t, "erin", last.Actor)
		require.Equal(t, "done", last.Result)
		res = demoOps(t, dbURL, "-provider-timeout", "500ms", "-provider-settle", "1s", "resolve", id, "made", "pr_X", "too late")
		require.Equal(t, 1, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stderr, "not resolvable")
	})

	t.Run("MadeOnTheOperatorsWord", func(t *testing.T) {
		id, key, body := waiting(t, "R-3")
		requireError(t, resolve(t, id, `{"outcome": "made", "providerRefundId": "nope", "reason": "x"}`), http.StatusBadRequest, "invalid_request")
		r := resolve(t, id, `{"outcome": "made", "providerRefundId": "pr_FROMTHEDASHBOARD", "reason": "seen in the provider's dashboard"}`)
		requireStatus(t, r, http.StatusOK)
		final := c.postUntilFinal("/refunds", key, body)
		requireStatus(t, final, http.StatusCreated)
		require.Equal(t, "pr_FROMTHEDASHBOARD", *decodeAs[refundBody](t, final).ProviderRefundID)
	})

	metrics := metricsOf(t, d)
	require.GreaterOrEqual(t, metrics[`idemflow_operator_requests_total{action="resolve",result="done"}`], 2.0)
	require.GreaterOrEqual(t, metrics[`idemflow_operator_requests_total{action="resolve",result="refused"}`], 2.0)
	require.False(t, strings.Contains(d.stdout.String(), "panic"))
	d.stop()
}
