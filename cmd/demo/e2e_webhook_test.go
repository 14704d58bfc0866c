package main

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestWebhooks: the fake provider tells the demo of every refund with a signed
// webhook, which confirms the refund once, however often and however
// concurrently it comes, whatever crashes, and even when it comes before the
// refund knows its provider id. The endpoint records the event itself, in the
// transaction that keeps it in the engine's inbox: no operation, no
// Operation-Id.
func TestWebhooks(t *testing.T) {
	t.Parallel()

	t.Run("ConfirmsOnceHoweverOften", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, nil)
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 1500})
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		eventually(t, func() bool { return c.getRefund(ref.RefundID).ProviderConfirmed }, "the refund is confirmed")
		awaitWebhooks(t, c) // the provider records the 2xx after it got it

		events := c.providerWebhooks()
		require.Len(t, events, 1)
		require.True(t, strings.HasPrefix(events[0].ID, "evt_"), events[0].ID)
		require.Equal(t, "refund.succeeded", events[0].Type)
		require.True(t, events[0].Delivered)
		var confirmedAt time.Time
		dbQueryRow(t, dbURL, "SELECT confirmed_at FROM demo_refund_confirmation WHERE refund_id = $1", []any{ref.RefundID}, &confirmedAt)

		// Every event five more times, at once: all answered, none applied again.
		c.redeliver(5)
		events = c.providerWebhooks()
		require.GreaterOrEqual(t, events[0].Deliveries, 6)
		requireOneEffect(t, dbURL, ref.RefundID, confirmedAt)
		require.True(t, c.getRefund(ref.RefundID).ProviderConfirmed)
	})

	t.Run("TwiceAtOnce", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, nil)
		body := providerEvent("evt_TWICE", "pr_TWICE", "A-1", 100)
		const n = 10
		answers := make([]*response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i], _ = d.postWebhook(t, body, signed(webhookSecret, body)) })
		}
		wg.Wait()
		first := 0
		for _, a := range answers {
			require.NotNil(t, a)
			requireStatus(t, a, http.StatusOK)
			switch string(a.body) {
			case `{"received":true}` + "\n", `{"received":true}`:
				first++
			default:
				require.JSONEq(t, `{"received": true, "duplicate": true}`, string(a.body))
			}
			require.Empty(t, a.header.Get("Operation-Id"), "no operation")
		}
		require.Equal(t, 1, first, "one delivery records the event")
		requireNoWebhookOperation(t, dbURL)
		require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_outcome WHERE event_id = 'evt_TWICE'"))
		require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event WHERE event_id = 'evt_TWICE'"))

		// The same id with another body is another event under a taken id:
		// under the same key (the engine's inbox finds it), under another key
		// (the demo's record of the body finds it), or with another type;
		// each answer names the body's top-level fields that differ.
		other := providerEvent("evt_TWICE", "pr_TWICE", "A-1", 999)
		e := requireError(t, d.webhook(t, other, webhookSecret), http.StatusUnprocessableEntity, "idempotency_key_reused")
		require.Equal(t, []string{"data"}, e.MismatchedFields)
		otherKey := []byte(strings.Replace(string(body), "key-of-pr_TWICE", "key-of-another", 1))
		e = requireError(t, d.webhook(t, otherKey, webhookSecret), http.StatusUnprocessableEntity, "idempotency_key_reused")
		require.Equal(t, []string{"data"}, e.MismatchedFields)
		otherType := []byte(strings.Replace(string(otherKey), "refund.succeeded", "refund.failed", 1))
		e = requireError(t, d.webhook(t, otherType, webhookSecret), http.StatusUnprocessableEntity, "idempotency_key_reused")
		require.Equal(t, []string{"data", "type"}, e.MismatchedFields)
		requireNoWebhookOperation(t, dbURL)
		require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_outcome WHERE event_id = 'evt_TWICE'"), "nothing of the refused deliveries kept")
		var amount int64
		dbQueryRow(t, dbURL, "SELECT amount FROM demo_provider_event WHERE event_id = 'evt_TWICE'", nil, &amount)
		require.EqualValues(t, 100, amount)
		again := d.webhook(t, body, webhookSecret)
		requireStatus(t, again, http.StatusOK)
		require.JSONEq(t, `{"received": true, "duplicate": true}`, string(again.body), "the first body stands")
	})

	t.Run("BadSignatures", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: []string{"-webhook-secret", "new-secret,old-secret"}})
		body := providerEvent("evt_SIG", "pr_SIG", "A-1", 100)
		now := time.Now()
		mac := strings.TrimPrefix(signed("new-secret", body), fmt.Sprintf("t=%d,", now.Unix()))
		for name, sig := range map[string]string{
			"missing":        "",
			"malformed":      "v1=abc",
			"no v1":          fmt.Sprintf("t=%d", now.Unix()),
			"wrong secret":   signed("demo-webhook-secret", body),
			"other body":     signed("new-secret", []byte(`{"id":"evt_SIG"}`)),
			"old timestamp":  webhook.Sign([]byte("new-secret"), now.Add(-6*time.Minute), body),
			"future":         webhook.Sign([]byte("new-secret"), now.Add(6*time.Minute), body),
			"timestamp lied": fmt.Sprintf("t=%d,%s", now.Add(-time.Second).Unix(), mac),
		} {
			r, err := d.postWebhook(t, body, sig)
			require.NoError(t, err)
			requireError(t, r, http.StatusBadRequest, "invalid_signature")
			require.Empty(t, r.header.Get("Operation-Id"), name)
		}
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_outcome"), "nothing recorded")
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event"))

		// A rotation: the old secret and the new one are both accepted, and
		// the provider signs with the new one (the first).
		requireStatus(t, d.webhook(t, body, "old-secret"), http.StatusOK)
		again := d.webhook(t, body, "new-secret")
		requireStatus(t, again, http.StatusOK)
		require.JSONEq(t, `{"received": true, "duplicate": true}`, string(again.body))
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100})
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		eventually(t, func() bool { return c.getRefund(ref.RefundID).ProviderConfirmed }, "the provider's webhook, signed with the new secret, confirmed the refund")
	})

	t.Run("NotAnEvent", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, nil)
		for _, body := range []string{
			`not json`,
			`{"type": "refund.succeeded"}`,
			`{"id": "evt_X", "type": "refund.succeeded"}`,
			`{"id": "evt_X", "type": "refund.succeeded", "data": {"refundId": 5}}`,
			`{"id": "evt_X", "type": "refund.succeeded", "data": {"refundId": "pr_\u0000"}}`,
			`{"id": "evt_X", "type": "refund.succeeded", "data": {"refundId": "pr_X", "orderId": "A-1", "amount": 1}}`,
		} {
			requireError(t, d.webhook(t, []byte(body), webhookSecret), http.StatusBadRequest, "invalid_event")
		}
		ignored := d.webhook(t, []byte(`{"id": "evt_Y", "type": "refund.updated"}`), webhookSecret)
		requireStatus(t, ignored, http.StatusOK)
		require.JSONEq(t, `{"received": true, "ignored": true}`, string(ignored.body))
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_outcome"), "nothing recorded")
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event"))
		// Only POST.
		r := d.client(t, "").get("/webhooks/provider")
		requireError(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
	})

	t.Run("KeptUntilTheRefundAppears", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		// finalize fails its first three attempts, so the provider's webhook,
		// sent as soon as it refunded, comes before the refund knows its
		// provider id.
		d := startDemo(t, dbURL, &demoOpts{env: []string{"DEMO_FAIL=finalize:3"}, args: []string{"-retry-backoff", "400ms", "-wait", "1ms"}})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 1500}
		r := c.post("/refunds", key, body)
		require.Equal(t, http.StatusAccepted, r.status, "body %s", r.body)

		eventually(t, func() bool { return dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event") == 1 }, "the event is kept")
		var status string
		var confirmed bool
		dbQueryRow(t, dbURL, `SELECT r.status, c.confirmed_at IS NOT NULL FROM demo_refund r
			JOIN demo_provider_event e ON e.order_id = r.order_id
			JOIN demo_refund_confirmation c ON c.provider_refund_id = e.provider_refund_id`, nil, &status, &confirmed)
		require.Equal(t, "pending", status, "the event came before finalize")
		require.False(t, confirmed)

		r = c.postUntilFinal("/refunds", key, body)
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		require.True(t, c.getRefund(ref.RefundID).ProviderConfirmed, "finalize applied the kept event")
		var confirmedAt time.Time
		dbQueryRow(t, dbURL, "SELECT confirmed_at FROM demo_refund_confirmation WHERE refund_id = $1", []any{ref.RefundID}, &confirmedAt)
		c.redeliver(2)
		requireOneEffect(t, dbURL, ref.RefundID, confirmedAt)

		// An event for a refund that never comes is kept, and confirms
		// nothing.
		requireStatus(t, d.webhook(t, providerEvent("evt_NEVER", "pr_NEVER", "A-404", 7), webhookSecret), http.StatusOK)
		eventually(t, func() bool {
			return dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event WHERE event_id = 'evt_NEVER'") == 1
		}, "the event is kept")
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM demo_refund_confirmation WHERE provider_refund_id = 'pr_NEVER' AND confirmed_at IS NOT NULL"))
	})

	t.Run("CrashBeforeTheAnswer", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		// The demo dies in the webhook's transaction, after its writes and
		// before it committed: the provider gets no answer, and delivers the
		// event again to the demo started after.
		d := startDemo(t, dbURL, &demoOpts{crash: "confirm:after-effect"})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 1500}
		_, _ = c.send(http.MethodPost, "/refunds", key, body) // may be cut by the crash
		require.Equal(t, crashExitCode, d.waitExit(), "exit status of DEMO_CRASH")
		require.Contains(t, d.stderr.String(), "DEMO_CRASH")

		d = startDemo(t, dbURL, nil)
		c = d.client(t, tokenA)
		r := c.postUntilFinal("/refunds", key, body)
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		eventually(t, func() bool { return c.getRefund(ref.RefundID).ProviderConfirmed }, "the event delivered again confirmed the refund")
		awaitWebhooks(t, c)
		events := c.providerWebhooks()
		require.Len(t, events, 1)
		require.True(t, events[0].Delivered)
		require.GreaterOrEqual(t, events[0].Deliveries, 2, "the first delivery got no answer")
		var confirmedAt time.Time
		dbQueryRow(t, dbURL, "SELECT confirmed_at FROM demo_refund_confirmation WHERE refund_id = $1", []any{ref.RefundID}, &confirmedAt)
		requireOneEffect(t, dbURL, ref.RefundID, confirmedAt)
	})
}

// requireOneEffect requires that the refund's confirmation happened once: one
// event recorded, once in the engine's inbox, confirmed at confirmedAt still.
func requireOneEffect(t *testing.T, dbURL, refundID string, confirmedAt time.Time) {
	t.Helper()
	require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM demo_provider_event"))
	require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_outcome"))
	requireNoWebhookOperation(t, dbURL)
	var again time.Time
	dbQueryRow(t, dbURL, "SELECT confirmed_at FROM demo_refund_confirmation WHERE refund_id = $1", []any{refundID}, &again)
	require.True(t, confirmedAt.Equal(again), "confirmed once: at %s, then at %s", confirmedAt, again)
}

// requireNoWebhookOperation requires that no event started an operation: the
// endpoint records events itself.
func requireNoWebhookOperation(t *testing.T, dbURL string) {
	t.Helper()
	require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_operation WHERE scope = $1 OR name = 'provider_event'", webhookScope))
}
