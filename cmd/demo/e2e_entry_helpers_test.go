package main

// Helpers of the entry points' tests (webhooks, the queue, settlements).

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/entry/webhook"
)

// The demo's default webhook secret, and the engine scope of the provider's
// events.
const (
	webhookSecret = "demo-webhook-secret"
	webhookScope  = "webhook:provider"
)

// withoutMember returns the JSON object body without its member name.
func withoutMember(t *testing.T, body []byte, name string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &m), "body %s", body)
	delete(m, name)
	out, err := json.Marshal(m)
	require.NoError(t, err)
	return out
}

// webhookEvent is an event as GET /provider/webhooks lists it.
type webhookEvent struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Deliveries int    `json:"deliveries"`
	Delivered  bool   `json:"delivered"`
}

// providerWebhooks lists the fake provider's webhook events.
func (c *apiClient) providerWebhooks() []webhookEvent {
	c.t.Helper()
	r := c.get("/provider/webhooks")
	requireStatus(c.t, r, http.StatusOK)
	body := decodeAs[struct {
		Events []webhookEvent `json:"events"`
	}](c.t, r)
	require.NotNil(c.t, body.Events, "events must be [], not null")
	return body.Events
}

// redeliver asks the fake provider to send every event copies more times,
// and requires that every copy got a 2xx.
func (c *apiClient) redeliver(copies int) {
	c.t.Helper()
	r := c.post("/provider/webhooks/redeliver", "", map[string]int{"copies": copies})
	requireStatus(c.t, r, http.StatusOK)
	var got struct{ Events, Sent, Delivered int }
	require.NoError(c.t, json.Unmarshal(r.body, &got))
	require.Equal(c.t, got.Events*copies, got.Sent, "body %s", r.body)
	require.Equal(c.t, got.Sent, got.Delivered, "every copy got a 2xx: %s", r.body)
}

// providerEvent is the body of a webhook event of the provider.
func providerEvent(id, providerRefundID, orderID string, amount int64) []byte {
	raw, err := json.Marshal(map[string]any{
		"id": id, "type": "refund.succeeded",
		"data": map[string]any{"refundId": providerRefundID, "idempotencyKey": "key-of-" + providerRefundID, "orderId": orderID, "amount": amount},
	})
	if err != nil {
		panic(err)
	}
	return raw
}

// signed returns the signature header of body under secret, now.
func signed(secret string, body []byte) string {
	return webhook.Sign([]byte(secret), time.Now(), body)
}

// postWebhook posts body to the demo's webhook endpoint, with the signature
// header sig unless it is empty.
func (d *demo) postWebhook(t *testing.T, body []byte, sig string) (*response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, d.base+"/webhooks/provider", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set("Provider-Signature", sig)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}, nil
}

// webhook posts body signed with secret and requires an answer.
func (d *demo) webhook(t *testing.T, body []byte, secret string) *response {
	t.Helper()
	r, err := d.postWebhook(t, body, signed(secret, body))
	require.NoError(t, err)
	return r
}

// dbCount returns the count(*) that query (one row, one column) reads in the
// database at dbURL.
func dbCount(t *testing.T, dbURL, query string, args ...any) int64 {
	t.Helper()
	var n int64
	dbQueryRow(t, dbURL, query, args, &n)
	return n
}

// dbQueryRow reads one row of query into dst.
func dbQueryRow(t *testing.T, dbURL, query string, args []any, dst ...any) {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	require.NoError(t, conn.QueryRow(ctx, query, args...).Scan(dst...), "%s", query)
}

// eventually polls cond every pollInterval until it holds, for at most
// finalTimeout.
func eventually(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, finalTimeout, pollInterval, append([]any{msg}, args...)...)
}

// awaitWebhooks waits until every webhook event the fake provider made so
// far got its 2xx from the demo: until then one may start an operation.
func awaitWebhooks(t *testing.T, c *apiClient) {
	t.Helper()
	c = c.in(t)
	eventually(t, func() bool {
		for _, ev := range c.providerWebhooks() {
			if !ev.Delivered {
				return false
			}
		}
		return true
	}, "every webhook delivered")
}
