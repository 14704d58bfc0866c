package main

// End-to-end tests of late and unknown outcomes with the demo binary: a
// provider slower than the call's timeout, pending refunds settled by webhook
// or by lookup (across a crash), the refusals that keep told answers final,
// and database trouble that does not use up a step's attempts.

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// setPending makes the provider's next count refund POSTs pending, settled as
// outcome delayMs later.
func (c *apiClient) setPending(count, delayMs int, outcome string) {
	c.t.Helper()
	r := c.post("/provider/faults", "", map[string]any{"mode": "pending", "count": count, "delayMs": delayMs, "outcome": outcome})
	require.Equal(c.t, http.StatusNoContent, r.status, "body %s", r.body)
}

// watchMerchant reads the client's accounts until stop is called, and returns
// whether the merchant's balance ever went back up to before after it had
// gone down to after: a reversal of the refund's ledger move, seen by a client.
func (c *apiClient) watchMerchant(before, after int64) (stop func() bool) {
	return c.watchBalance("merchant", before, after)
}

// watchBalance reads the client's accounts until stop is called, and returns
// whether the balance of the account name ever went back to before after it
// had moved to after.
func (c *apiClient) watchBalance(name string, before, after int64) (stop func() bool) {
	var reversed atomic.Bool
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		moved := false
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r, err := c.send(http.MethodGet, "/accounts", "", nil)
			if err != nil || r.status != http.StatusOK {
				continue
			}
			var body struct {
				Accounts []account `json:"accounts"`
			}
			if decodeErr := json.Unmarshal(r.body, &body); decodeErr != nil {
				continue
			}
			switch balance(body.Accounts, name) {
			case after:
				moved = true
			case before:
				if moved {
					reversed.Store(true)
				}
			}
		}
	})
	return func() bool {
		close(done)
		wg.Wait()
		return reversed.Load()
	}
}

// TestSlowProvider: the provider carries each request out long after the
// call timed out, in every attempt, but within -provider-settle. The refund
// is made once, answered 201, and no reversal is ever visible.
func TestSlowProvider(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{
		"-max-attempts", "2", "-retry-backoff", "100ms", "-provider-timeout", "300ms", "-provider-settle", "20s",
	}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	c.setFault("slow", 2, 1500)
	watch := c.watchMerchant(5000, 4300)

	r := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700})
	reversed := watch()
	requireStatus(t, r, http.StatusCreated)
	require.False(t, reversed, "a reversal of the ledger move was visible in GET /accounts")
	op := c.getOperation(r.header.Get("Operation-Id"))
	prov := stepOf(t, op, "provider")
	require.Equal(t, 2, prov.Attempts)
	// The late refund's webhook, or the lookup, settled the waiting step.
	require.Contains(t, []string{"lookup", "event"}, prov.ResolvedBy)
	refunds := c.providerRefunds()
	require.Len(t, refunds, 1, "one provider refund")
	require.Equal(t, prov.DerivedKey, refunds[0].IdempotencyKey)
	c.requireBooks(5000, 700)
	d.stop()
}

// TestPendingRefund: the provider accepts refunds as pending and settles them
// later; the refund waits, with its provider step waiting, until the
// provider's webhook or its lookup says how it ended.
func TestPendingRefund(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name    string
		outcome string
		// webhooks false holds them back (they go to a closed port): the lookup settles it.
		webhooks   bool
		resolvedBy string
	}{
		{"SucceededByWebhook", "succeeded", true, "event"},
		{"FailedByWebhook", "failed", true, ""},
		{"SucceededByLookup", "succeeded", false, "lookup"},
		{"FailedByLookup", "failed", false, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// With webhooks, the lookup is asked only after 5 s: the event comes first.
			args := []string{"-retry-backoff", "5s", "-wait", "200ms"}
			if !tt.webhooks {
				args = []string{"-retry-backoff", "100ms", "-wait", "200ms", "-webhook-url", "http://" + closedPort(t) + "/webhooks/provider"}
			}
			d := startDemo(t, testdb.URL(t), &demoOpts{args: args})
			c := d.client(t, tokenA)
			c.createOrder("A-1", "cus_1", 5000)
			c.setPending(1, 700, tt.outcome)

			key := newKey()
			body := map[string]any{"orderId": "A-1", "amount": 700}
			id := requireAccepted(t, c.post("/refunds", key, body))
			waiting := c.awaitOperation(id, pollInterval, "the provider step waiting", func(op operation) bool {
				return stepOf(t, op, "provider").Status == "waiting"
			})
			require.Equal(t, "in_progress", waiting.Status)

			r := c.postUntilFinal("/refunds", key, body)
			op := c.getOperation(id)
			prov := stepOf(t, op, "provider")
			require.Equal(t, 1, prov.Attempts, "a pending refund is not asked again")
			refunds := c.providerRefunds()
			require.Len(t, refunds, 1)
			require.Equal(t, tt.outcome, refunds[0].Status)
			if tt.outcome == "succeeded" {
				requireStatus(t, r, http.StatusCreated)
				require.Equal(t, tt.resolvedBy, prov.ResolvedBy)
				c.requireBooks(5000, 700)
			} else {
				requireError(t, r, http.StatusPaymentRequired, "provider_refund_failed")
				again := c.post("/refunds", key, body)
				require.Equal(t, string(r.body), string(again.body), "byte-identical replay")
				require.Equal(t, []string{"ledger:compensated", "provider:failed", "finalize:skipped"}, stepStatuses(op))
				c.requireBooks(5000, 0)
				o := c.getOrder("A-1")
				require.Len(t, o.Refunds, 1)
				require.Equal(t, "failed", o.Refunds[0].Status)
			}
			d.stop()
		})
	}

	t.Run("CrashWhileWaiting", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		args := []string{"-retry-backoff", "100ms", "-wait", "200ms", "-lease", "1s",
			"-webhook-url", "http://" + closedPort(t) + "/webhooks/provider"}
		d := startDemo(t, dbURL, &demoOpts{args: args})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		c.setPending(1, 3000, "succeeded")
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		c.awaitOperation(id, pollInterval, "the provider step waiting", func(op operation) bool {
			return stepOf(t, op, "provider").Status == "waiting"
		})
		const gauge = `idemflow_operations_waiting{operation="refund",reason="outcome"}`
		require.Eventually(t, func() bool { return metricsOf(t, d)[gauge] == 1 }, finalTimeout, pollInterval, "the waiting operation is counted")
		d.kill()

		d2 := startDemo(t, dbURL, &demoOpts{args: args})
		c2 := d2.client(t, tokenA)
		r := c2.postUntilFinal("/refunds", key, body)
		requireStatus(t, r, http.StatusCreated)
		prov := stepOf(t, c2.getOperation(id), "provider")
		require.Equal(t, 1, prov.Attempts)
		require.Equal(t, "lookup", prov.ResolvedBy)
		refunds := c2.providerRefunds()
		require.Len(t, refunds, 1)
		require.Equal(t, 1, refunds[0].Requests)
		c2.requireBooks(5000, 700)
		d2.stop()
	})
}

// TestToldAnswersFinal: an operator's retry refuses a refund whose client was
// told a business answer or a cancel, and a 500 unless forced; cancel refuses
// while the provider may still carry the refund out.
func TestToldAnswersFinal(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	// Every provider attempt fails: the provider step waits out its backoff
	// between attempts, for the cancel.
	d := startDemo(t, dbURL, &demoOpts{
		args: []string{"-retry-backoff", "3s", "-wait", "200ms", "-provider-timeout", "500ms", "-provider-settle", "1s"},
		env:  []string{"DEMO_FAIL=provider:1000"},
	})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)

	// A business answer: order_not_found.
	notFound := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "nope", "amount": 1})
	requireError(t, notFound, http.StatusNotFound, "order_not_found")
	requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+notFound.header.Get("Operation-Id")+"/retry", `{"force": true}`),
		http.StatusConflict, "operation_final")
	res := demoOps(t, dbURL, "retry", notFound.header.Get("Operation-Id"))
	require.Equal(t, 1, res.code, "stdout %s\nstderr %s", res.stdout, res.stderr)
	require.Contains(t, res.stderr, "final")

	// A cancel: refused while the provider step's last request may land,
	// then done.
	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 700}
	id := requireAccepted(t, c.post("/refunds", key, body))
	c.awaitOperation(id, pollInterval, "a failed provider attempt", func(op operation) bool {
		return stepOf(t, op, "provider").Attempts >= 1
	})
	sawUnknown := false
	require.Eventually(t, func() bool {
		cancel := d.admin(t, http.MethodPost, "/admin/operations/"+id+"/cancel", `{"reason": "customer withdrew"}`)
		if cancel.status == http.StatusConflict && errorOf(t, cancel).Code == "outcome_unknown" {
			sawUnknown = true
			require.Contains(t, errorOf(t, cancel).Message, "known by")
		}
		return cancel.status == http.StatusOK
	}, finalTimeout, 50*time.Millisecond)
	require.True(t, sawUnknown, "the cancel was refused while the request could still land")
	cancelled := c.post("/refunds", key, body)
	requireError(t, cancelled, http.StatusUnprocessableEntity, "cancelled")
	requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+id+"/retry", ""), http.StatusConflict, "operation_final")
	requireError(t, d.admin(t, http.MethodPost, "/admin/operations/"+id+"/retry", `{"force": true}`), http.StatusConflict, "operation_final")
	again := c.post("/refunds", key, body)
	require.Equal(t, string(cancelled.body), string(again.body), "the key keeps its answer")
	c.requireBooks(5000, 0)
	d.stop()
}

// TestHeldRowLock: a row lock held longer than the refunds' attempts last
// (each waits out lock_timeout) uses up none of them: every refund succeeds
// once the lock is released.
func TestHeldRowLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-max-attempts", "2", "-retry-backoff", "100ms", "-wait", "200ms"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 50000)

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM demo_order FOR UPDATE`)
	require.NoError(t, err)

	const n = 10
	keys := make([]string, n)
	ids := make([]string, n)
	body := map[string]any{"orderId": "A-1", "amount": 100}
	for i := range keys {
		keys[i] = newKey()
		ids[i] = requireAccepted(t, c.post("/refunds", keys[i], body))
	}
	// Every refund's ledger step fails more often than -max-attempts allows.
	for _, id := range ids {
		c.awaitOperation(id, pollInterval, "a ledger attempt that met the lock", func(op operation) bool {
			l := stepOf(t, op, "ledger")
			return l.LastError != nil
		})
	}
	// The lock outlasts more ledger attempts than -max-attempts allows.
	const retried = `idemflow_step_attempts_total{operation="refund",outcome="retried",step="ledger"}`
	require.Eventually(t, func() bool { return metricsOf(t, d)[retried] > 3*n }, finalTimeout, pollInterval)
	for _, id := range ids {
		op := c.getOperation(id)
		require.Equal(t, "in_progress", op.Status)
		require.Contains(t, *stepOf(t, op, "ledger").LastError, "database")
	}
	require.NoError(t, tx.Rollback(ctx))

	for _, key := range keys {
		requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)
	}
	c.requireBooks(50000, n*100)
	d.stop()
}
