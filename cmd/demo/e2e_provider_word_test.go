package main

// End-to-end tests of the provider's word, whenever it arrives
// (docs/demo-api.md, "Late and unknown outcomes"; issue 36, findings 1 to
// 3): a provider event that outweighs a lookup lagging past the window,
// whether it comes before the step waits or while it waits; the window
// stored when the request is sent, which a process with other flags (demo
// ops: cancel, resolve not-made) decides against; and a failure event that
// the provider's lookup contradicts, which changes nothing.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// refundEvent is the body of a provider webhook event of type typ
// ("refund.succeeded" or "refund.failed") for the provider refund
// providerRefundID, made under the derived key key.
func refundEvent(t *testing.T, id, typ, providerRefundID, key, orderID string, amount int64) []byte {
	t.Helper()
	status := "succeeded"
	if typ == "refund.failed" {
		status = "failed"
	}
	raw, err := json.Marshal(map[string]any{
		"id": id, "type": typ,
		"data": map[string]any{"refundId": providerRefundID, "idempotencyKey": key, "orderId": orderID, "amount": amount, "status": status},
	})
	require.NoError(t, err)
	return raw
}

// lookup asks the fake provider for the refund made under key, as the
// provider step's lookup does, and returns the answer.
func (c *apiClient) lookup(key string) *response {
	c.t.Helper()
	return c.get("/provider/refunds/by-key/" + url.PathEscape(key))
}

// awaitProviderWaiting waits until the refund operation id's provider step
// waits, and returns the operation.
func (c *apiClient) awaitProviderWaiting(id string) operation {
	c.t.Helper()
	return c.awaitOperation(id, pollInterval, "the provider step waiting", func(op operation) bool {
		return stepOf(c.t, op, "provider").Status == "waiting"
	})
}

// heldWebhooks is a webhook endpoint in front of a demo's that holds every
// delivery until release is called, then passes it on to the demo at
// target (set once the demo listens).
type heldWebhooks struct {
	url     string
	target  atomic.Pointer[string]
	hold    chan struct{}
	release func()
}

func newHeldWebhooks(t *testing.T) *heldWebhooks {
	t.Helper()
	h := &heldWebhooks{hold: make(chan struct{})}
	h.release = sync.OnceFunc(func() { close(h.hold) })
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		u, err := url.Parse(*h.target.Load())
		if err == nil {
			r.SetURL(u)
		}
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-h.hold:
		case <-r.Context().Done():
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(h.release)
	h.url = srv.URL + "/webhooks/provider"
	return h
}

// TestEarlyEvent (finding 1 of issue 36): the provider makes the refund and
// sends its refund.succeeded event at once, the demo's call gets 503, and the
// provider's lookup by key answers 404 far past the step's window (a search
// index that lags behind the provider's records). The event is the step's
// success, whether it arrives before the step waits or while it waits: the
// refund ends 201, resolvedBy "event", and GET /accounts never shows the
// ledger move reversed.
func TestEarlyEvent(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name string
		// held holds the event back until the provider step waits.
		held bool
	}{
		{name: "BeforeTheStepWaits"},
		{name: "WhileTheStepWaits", held: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"-max-attempts", "1", "-provider-settle", "2s", "-provider-timeout", "1s", "-wait", "200ms"}
			var hooks *heldWebhooks
			if tt.held {
				hooks = newHeldWebhooks(t)
				args = append(args, "-webhook-url", hooks.url)
			}
			d := startDemo(t, testdb.URL(t), &demoOpts{args: args})
			if hooks != nil {
				hooks.target.Store(&d.base)
			}
			c := d.client(t, tokenA)
			c.createOrder("A-1", "cus_1", 5000)
			// The lookup lags 60 s: longer than the window, and than the test.
			c.setFault("lagging_lookup", 1, 60_000)
			watch := c.watchBalance("customer:cus_1", -5000, -4300)

			key := newKey()
			body := map[string]any{"orderId": "A-1", "amount": 700}
			if hooks != nil {
				id := requireAccepted(t, c.post("/refunds", key, body))
				c.awaitProviderWaiting(id)
				hooks.release()
			}
			r := c.postUntilFinal("/refunds", key, body)
			reversed := watch()
			requireStatus(t, r, http.StatusCreated)
			require.False(t, reversed, "a reversal of the ledger move was visible in GET /accounts")

			op := c.getOperation(r.header.Get("Operation-Id"))
			require.Equal(t, "succeeded", op.Status)
			prov := stepOf(t, op, "provider")
			require.Equal(t, 1, prov.Attempts)
			require.Equal(t, "event", prov.ResolvedBy)
			if tt.held {
				// It waited: the 503's window is stored with it. An event
				// that came first decides it before any wait is recorded.
				require.NotNil(t, prov.SettleBy, "the 503's window is stored with the step")
			}

			// The lookup still finds nothing: the event alone decided.
			requireError(t, c.lookup(prov.DerivedKey), http.StatusNotFound, "refund_not_found")
			refunds := c.providerRefunds()
			require.Len(t, refunds, 1, "the list shows the refund at once")
			require.Equal(t, prov.DerivedKey, refunds[0].IdempotencyKey)
			require.Equal(t, 1, refunds[0].Requests)
			require.Equal(t, refunds[0].ID, *decodeAs[refundBody](t, r).ProviderRefundID)

			// The key keeps its answer and the books their move.
			again := c.post("/refunds", key, body)
			require.Equal(t, string(r.body), string(again.body), "byte-identical replay")
			require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			accounts := c.requireBooks(5000, 700)
			require.EqualValues(t, -4300, balance(accounts, "customer:cus_1"))
			d.stop()
		})
	}
}

// cancelWithShortWindow runs demo ops cancel on the operation id, as the
// operator erin, with a window of 100 ms (the server's is longer), asking
// again while a killed demo's lease (1 s) still holds the operation.
func cancelWithShortWindow(t *testing.T, dbURL, providerURL, id string) opsResult {
	t.Helper()
	for deadline := time.Now().Add(finalTimeout); ; {
		res := demoOps(t, dbURL, "-provider-timeout", "100ms", "-provider-settle", "100ms", "-provider-url", providerURL,
			"-actor", "erin", "cancel", id, "customer withdrew")
		if !strings.Contains(res.stderr, "operation is running") || time.Now().After(deadline) {
			return res
		}
		time.Sleep(pollInterval)
	}
}

// requireOutcomeUnknown requires that res is demo ops's refusal of a cancel
// whose outcome is not known yet, and returns the moment it names: when the
// outcome will be known.
func requireOutcomeUnknown(t *testing.T, res opsResult) time.Time {
	t.Helper()
	require.Equal(t, 1, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
	require.Contains(t, res.stderr, "not known yet")
	_, by, ok := strings.Cut(res.stderr, "known by ")
	require.True(t, ok, "the refusal says when the outcome will be known: %s", res.stderr)
	knownBy, err := time.Parse(time.RFC3339, strings.TrimSpace(by))
	require.NoError(t, err, "stderr %s", res.stderr)
	return knownBy
}

// TestWindowStoredWithTheStep (finding 2 of issue 36): the window of a
// request is fixed when it is sent, stored by the database's clock (the
// step's settleBy), and every "not made" is decided against it: demo ops
// with a window of its own far shorter than the server's cannot cancel the
// refund of a killed demo before the stored moment, while the provider may
// still carry the request out (it does, later, within the window), whether
// the demo was killed while the step waited or in the middle of its call;
// nor resolve it as not made.
func TestWindowStoredWithTheStep(t *testing.T) {
	t.Parallel()
	const settle = 10 * time.Second

	// setup starts a provider alone, as a real one runs (it outlives the demo
	// that is killed, and demo ops asks it too), and a demo with a call
	// timeout of timeout, which has an order A-1 of 5000 for cus_1.
	setup := func(t *testing.T, timeout time.Duration) (dbURL string, p, d *demo, args []string) {
		dbURL = testdb.URL(t)
		p = startDemo(t, dbURL, &demoOpts{provider: true})
		args = []string{"-max-attempts", "1", "-provider-timeout", timeout.String(), "-provider-settle", settle.String(),
			"-wait", "200ms", "-provider-url", p.base + "/provider"}
		d = startDemo(t, dbURL, &demoOpts{args: args})
		d.client(t, tokenA).createOrder("A-1", "cus_1", 5000)
		return dbURL, p, d, args
	}

	t.Run("KilledWhileWaiting", func(t *testing.T) {
		t.Parallel()
		dbURL, p, d, args := setup(t, time.Second)
		c := d.client(t, tokenA)

		// A step that sent nothing shows "settleBy": null: a refund that its
		// ledger step refused never calls the provider.
		notFound := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "nope", "amount": 1})
		requireError(t, notFound, http.StatusNotFound, "order_not_found")
		raw := c.get("/operations/" + notFound.header.Get("Operation-Id"))
		requireStatus(t, raw, http.StatusOK)
		var shape struct {
			Steps []map[string]json.RawMessage `json:"steps"`
		}
		require.NoError(t, json.Unmarshal(raw.body, &shape))
		require.Len(t, shape.Steps, 3)
		require.JSONEq(t, `"provider"`, string(shape.Steps[1]["name"]))
		require.Contains(t, shape.Steps[1], "settleBy", "the provider step shows settleBy: %s", raw.body)
		require.Equal(t, "null", string(shape.Steps[1]["settleBy"]))

		// The provider carries the request out 6 s after it arrived: after
		// the call's timeout, within the window.
		p.client(t, "").setFault("slow", 1, 6000)
		watch := c.watchBalance("customer:cus_1", -5000, -4300)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		op := c.awaitOperation(id, pollInterval, "the provider step waiting with its window stored", func(op operation) bool {
			p := stepOf(t, op, "provider")
			return p.Status == "waiting" && p.SettleBy != nil
		})
		prov := stepOf(t, op, "provider")
		settleBy := *prov.SettleBy
		require.NotNil(t, prov.StartedAt)
		require.False(t, settleBy.Before(prov.StartedAt.Add(settle)), "settleBy %s is the request's sending plus %s (step started %s)", settleBy, settle, prov.StartedAt)
		d.kill()

		// demo ops refuses a window shorter than the call's timeout, as the
		// server does.
		res := demoOps(t, dbURL, "-provider-settle", "1ms", "cancel", id)
		require.Equal(t, 2, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stderr, "-provider-settle")
		require.Contains(t, res.stderr, "-provider-timeout")

		// demo ops with a window of 100 ms, the server's 10 s stored with the
		// step: refused until the stored moment, which it names.
		knownBy := requireOutcomeUnknown(t, cancelWithShortWindow(t, dbURL, p.base+"/provider", id))
		require.False(t, knownBy.Before(settleBy.Truncate(time.Second)), "known by %s, the step's settleBy %s", knownBy, settleBy)
		// So is an operator's "not made".
		res = demoOps(t, dbURL, "-provider-timeout", "100ms", "-provider-settle", "100ms", "-provider-url", p.base+"/provider",
			"resolve", id, "not-made", "the provider has no record of it")
		require.Equal(t, 1, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stderr, "not resolvable")
		require.Contains(t, res.stderr, settleBy.UTC().Truncate(time.Second).Format(time.RFC3339), "the refusal names the stored moment")

		// A demo started again finishes it: the provider carried the request
		// out, and the refund goes forward.
		d2 := startDemo(t, dbURL, &demoOpts{args: args})
		c2 := d2.client(t, tokenA)
		r := c2.postUntilFinal("/refunds", key, body)
		reversed := watch()
		requireStatus(t, r, http.StatusCreated)
		require.False(t, reversed, "a reversal of the ledger move was visible in GET /accounts")
		final := stepOf(t, c2.getOperation(id), "provider")
		require.Equal(t, "lookup", final.ResolvedBy, "the provider run alone sends no webhooks")
		require.NotNil(t, final.SettleBy)
		require.True(t, settleBy.Equal(*final.SettleBy), "settleBy kept: %s, then %s", settleBy, final.SettleBy)
		refunds := p.client(t, "").providerRefunds()
		require.Len(t, refunds, 1)
		require.Equal(t, 1, refunds[0].Requests)
		c2.requireBooks(5000, 700)

		// The audit trail has the refused cancel, by erin, and the refused
		// resolve.
		adm := d2.admin(t, http.MethodGet, "/admin/operations/"+id, "")
		requireStatus(t, adm, http.StatusOK)
		var audited adminOp
		require.NoError(t, json.Unmarshal(adm.body, &audited))
		require.GreaterOrEqual(t, len(audited.Audit), 2)
		cancel, resolve := audited.Audit[len(audited.Audit)-2], audited.Audit[len(audited.Audit)-1]
		require.Equal(t, []string{"cancel", "erin", "refused"}, []string{cancel.Action, cancel.Actor, cancel.Result})
		require.Equal(t, []string{"resolve", "refused"}, []string{resolve.Action, resolve.Result})
		d2.stop()
	})

	// The case: the demo killed after its 202, while the provider
	// still holds its request (slow) and the call has not timed out.
	t.Run("KilledMidCall", func(t *testing.T) {
		t.Parallel()
		dbURL, p, d, args := setup(t, 5*time.Second)
		c := d.client(t, tokenA)
		// Carried out 8 s after it arrived: after the kill and the cancel,
		// within the window.
		p.client(t, "").setFault("slow", 1, 8000)
		watch := c.watchBalance("customer:cus_1", -5000, -4300)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		op := c.getOperation(id)
		require.Equal(t, "running", stepOf(t, op, "provider").Status, "the call is in flight")
		d.kill()

		// The request was sent after the operation was created: its outcome
		// is not known before then plus the server's window.
		knownBy := requireOutcomeUnknown(t, cancelWithShortWindow(t, dbURL, p.base+"/provider", id))
		require.False(t, knownBy.Before(op.CreatedAt.Add(settle).Truncate(time.Second)),
			"known by %s, the operation created at %s, the window %s", knownBy, op.CreatedAt, settle)

		d2 := startDemo(t, dbURL, &demoOpts{args: args})
		c2 := d2.client(t, tokenA)
		r := c2.postUntilFinal("/refunds", key, body)
		requireStatus(t, r, http.StatusCreated)
		// The provider holds one refund under the key, whichever request
		// made it (the resumed run's, or the slow one).
		refunds := p.client(t, "").providerRefunds()
		require.Len(t, refunds, 1)
		require.Equal(t, refunds[0].ID, *decodeAs[refundBody](t, r).ProviderRefundID)
		if stepOf(t, c2.getOperation(id), "provider").ResolvedBy == "call" {
			// The resumed run's request made it; the slow one lands within
			// the window as a repeat, and changes nothing.
			eventually(t, func() bool { return p.client(t, "").providerRefunds()[0].Requests == 2 }, "the slow request carried out")
		}
		require.False(t, watch(), "a reversal of the ledger move was visible in GET /accounts")
		c2.requireBooks(5000, 700)
		d2.stop()
	})
}

// TestFailureEventContradicted (finding 3 of issue 36): a pending refund, and
// a signed refund.failed event for it while the provider's lookup says
// pending (or cannot answer), before the provider pays it: the event changes
// nothing, the refund ends 201, never 402, and the ledger move is never
// reversed. An event that names another provider refund id than the one the
// provider answered is not the step's either. The fake provider makes no such
// event (its events match its records), so the test signs them itself.
func TestFailureEventContradicted(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name string
		// lookupDown makes every lookup answer 503 while the event arrives
		// and until the provider paid.
		lookupDown bool
		// otherReference names another provider refund id in a
		// refund.succeeded event, rather than a refund.failed one.
		otherReference bool
	}{
		{name: "WhileTheLookupSaysPending"},
		{name: "WhileTheLookupCannotAnswer", lookupDown: true},
		{name: "AnotherReference", otherReference: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dbURL := testdb.URL(t)
			d := startDemo(t, dbURL, &demoOpts{args: []string{"-wait", "200ms", "-retry-backoff", "100ms"}})
			c := d.client(t, tokenA)
			c.createOrder("A-1", "cus_1", 5000)
			// Pending 4 s, then paid.
			c.setPending(1, 4000, "succeeded")
			watch := c.watchBalance("customer:cus_1", -5000, -4300)

			key := newKey()
			body := map[string]any{"orderId": "A-1", "amount": 700}
			id := requireAccepted(t, c.post("/refunds", key, body))
			prov := stepOf(t, c.awaitProviderWaiting(id), "provider")
			refunds := c.providerRefunds()
			require.Len(t, refunds, 1)
			require.Equal(t, "pending", refunds[0].Status)
			pr := refunds[0].ID
			if tt.lookupDown {
				c.setFault("lookup_error", 1_000_000, 0)
			}

			ev := refundEvent(t, "evt_FAILEDBYWORD", "refund.failed", pr, prov.DerivedKey, "A-1", 700)
			if tt.otherReference {
				ev = refundEvent(t, "evt_OTHERREFUND", "refund.succeeded", "pr_SOMEONEELSES", prov.DerivedKey, "A-1", 700)
			}
			requireStatus(t, d.webhook(t, ev, webhookSecret), http.StatusOK)
			// The event is weighed by the waiting step, and changes nothing
			// while the provider says pending, or cannot say.
			r := c.post("/refunds", key, body)
			requireInProgress(t, r, id)
			if tt.lookupDown {
				// The lookup was asked, and could not answer, after the event.
				var left int64
				dbQueryRow(t, dbURL, "SELECT remaining FROM provider.fault", nil, &left)
				eventually(t, func() bool {
					var now int64
					dbQueryRow(t, dbURL, "SELECT remaining FROM provider.fault", nil, &now)
					return now < left
				}, "a lookup answered 503 after the event")
				requireInProgress(t, c.post("/refunds", key, body), id)
				// The provider pays; its refund.succeeded event settles the
				// step while the lookup still cannot answer.
			}

			final := c.postUntilFinal("/refunds", key, body)
			reversed := watch()
			requireStatus(t, final, http.StatusCreated)
			require.False(t, reversed, "a reversal of the ledger move was visible in GET /accounts")
			require.Equal(t, pr, *decodeAs[refundBody](t, final).ProviderRefundID)

			op := c.getOperation(id)
			require.Equal(t, []string{"ledger:succeeded", "provider:succeeded", "finalize:succeeded"}, stepStatuses(op))
			prov = stepOf(t, op, "provider")
			require.Equal(t, 1, prov.Attempts, "a pending refund is not asked again")
			if tt.lookupDown {
				require.Equal(t, "event", prov.ResolvedBy, "the provider's own event, the lookup being down")
			} else {
				require.Contains(t, []string{"event", "lookup"}, prov.ResolvedBy)
			}
			refunds = c.providerRefunds()
			require.Len(t, refunds, 1)
			require.Equal(t, "succeeded", refunds[0].Status)
			c.requireBooks(5000, 700)
			if tt.otherReference {
				// Another reference is a mismatch at once, in the report
				// before any run, and draws attention to the finished refund.
				rep := d.reconciliation(t)
				require.Len(t, rep.Mismatches, 1, "report %+v", rep)
				require.Equal(t, "reference_differs", rep.Mismatches[0].Kind)
				require.Equal(t, prov.DerivedKey, rep.Mismatches[0].IdempotencyKey)
				require.True(t, c.getOperation(id).NeedsAttention, "the refund named by an event of another provider refund id needs attention")
			}
			require.False(t, strings.Contains(d.stdout.String(), "panic"))
			d.stop()
		})
	}
}
