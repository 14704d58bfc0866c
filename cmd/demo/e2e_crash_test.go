package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestCrash crashes the demo (DEMO_CRASH, exit status 86) at each point of each
// step of a refund, starts it again on the same database, and retries the key as
// a client would until it gets a final answer: the refund succeeded, with one
// ledger move and one refund at the provider, asked for once.
func TestCrash(t *testing.T) {
	t.Parallel()
	for _, stepName := range []string{"ledger", "provider", "finalize"} {
		for _, point := range []string{"before", "after-effect"} {
			at := stepName + ":" + point
			t.Run(at, func(t *testing.T) {
				t.Parallel()
				dbURL := testdb.URL(t)
				d := startDemo(t, dbURL, &demoOpts{crash: at})
				c := d.client(t, tokenA)
				c.createOrder("A-1042", "cus_1", 5000)

				key := newKey()
				body := map[string]any{"orderId": "A-1042", "amount": 1499}
				r, err := c.send(http.MethodPost, "/refunds", key, body)
				require.Error(t, err, "the crash cuts the connection; got %+v", r)
				require.Equal(t, crashExitCode, d.waitExit(), "exit status of DEMO_CRASH")
				require.Contains(t, d.stderr.String(), "DEMO_CRASH")

				d = startDemo(t, dbURL, nil)
				c = d.client(t, tokenA)
				r = c.postUntilFinal("/refunds", key, body)
				requireStatus(t, r, http.StatusCreated)
				ref := decodeAs[refundBody](t, r)
				require.Equal(t, "succeeded", ref.Status)
				require.Equal(t, int64(1499), ref.Amount)
				if stepName == "ledger" {
					// Nothing had committed: the retry ran the operation anew.
					require.Empty(t, r.header.Get("Idempotent-Replayed"))
				} else {
					// The restarted demo resumed the operation; the retry read its answer.
					require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
				}

				op := c.getOperation(r.header.Get("Operation-Id"))
				require.Equal(t, "succeeded", op.Status)
				require.Equal(t, key, op.Key)
				for _, st := range op.Steps {
					require.Equal(t, "succeeded", st.Status, "step %s", st.Name)
				}
				require.Equal(t, 1, op.Steps[0].Attempts, "the ledger step ran once")

				// One refund at the provider, asked for once, under the derived key.
				refunds := c.providerRefunds()
				require.Len(t, refunds, 1)
				require.Equal(t, op.Steps[1].DerivedKey, refunds[0].IdempotencyKey)
				require.Equal(t, 1, refunds[0].Requests)
				require.Equal(t, *ref.ProviderRefundID, refunds[0].ID)
				require.True(t, strings.HasPrefix(refunds[0].ID, "pr_"))

				// One ledger move: one refund on the order, and the books balance.
				o := c.getOrder("A-1042")
				require.Len(t, o.Refunds, 1)
				require.Equal(t, ref.RefundID, o.Refunds[0].RefundID)
				require.Equal(t, "succeeded", o.Refunds[0].Status)
				require.Equal(t, int64(1499), o.Refunded)
				accounts := c.requireBooks(5000, 1499)
				require.Equal(t, int64(-5000+1499), balance(accounts, "customer:cus_1"))
				d.stop()
			})
		}
	}
}

// TestCrashOrder crashes the demo in the order operation's only step: nothing
// was committed, so the client's retry after a restart records the order once.
func TestCrashOrder(t *testing.T) {
	t.Parallel()
	for _, point := range []string{"before", "after-effect"} {
		at := "record:" + point
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			dbURL := testdb.URL(t)
			d := startDemo(t, dbURL, &demoOpts{crash: at})
			c := d.client(t, tokenA)
			key := newKey()
			body := map[string]any{"orderId": "A-1", "customerId": "cus_1", "amount": 5000}
			r, err := c.send(http.MethodPost, "/orders", key, body)
			require.Error(t, err, "the crash cuts the connection; got %+v", r)
			require.Equal(t, crashExitCode, d.waitExit(), "exit status of DEMO_CRASH")

			d = startDemo(t, dbURL, nil)
			c = d.client(t, tokenA)
			r = c.postUntilFinal("/orders", key, body)
			requireStatus(t, r, http.StatusCreated)
			require.Empty(t, r.header.Get("Idempotent-Replayed"))
			c.requireBooks(5000, 0)
			d.stop()
		})
	}
}
