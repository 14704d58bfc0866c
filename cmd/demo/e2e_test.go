package main

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestAuth checks the bearer tokens and that every object belongs to the client
// that made it.
func TestAuth(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	a, b := d.client(t, tokenA), d.client(t, tokenB)
	// The default clients are printed at start.
	for _, s := range []string{"merchant-a", tokenA, "merchant-b", tokenB} {
		require.Contains(t, d.stdout.String(), s)
	}

	t.Run("Unauthenticated", func(t *testing.T) {
		for _, token := range []string{"", "not-a-token", tokenA + "x"} {
			c := d.client(t, token)
			for _, r := range []*response{
				c.post("/orders", newKey(), map[string]any{"orderId": "A-1", "customerId": "cus_1", "amount": 100}),
				c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100}),
				c.get("/orders/A-1"),
				c.get("/refunds/re_X"),
				c.get("/accounts"),
				c.get("/operations/" + uuid.NewString()),
			} {
				requireError(t, r, http.StatusUnauthorized, "unauthenticated")
			}
		}
		// A token in another scheme is no bearer token.
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, d.base+"/accounts", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Basic "+tokenA)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

		// /healthz and the provider need no token.
		r := d.client(t, "").get("/healthz")
		requireStatus(t, r, http.StatusOK)
		require.JSONEq(t, `{"status":"ok"}`, string(r.body))
		requireStatus(t, d.client(t, "").get("/provider/refunds"), http.StatusOK)
	})

	t.Run("OtherClientsObjects", func(t *testing.T) {
		a, b := a.in(t), b.in(t)
		a.createOrder("A-1042", "cus_1", 5000)
		r := a.post("/refunds", newKey(), map[string]any{"orderId": "A-1042", "amount": 1000})
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		opID := r.header.Get("Operation-Id")

		requireError(t, b.get("/orders/A-1042"), http.StatusNotFound, "order_not_found")
		requireError(t, b.get("/refunds/"+ref.RefundID), http.StatusNotFound, "refund_not_found")
		requireError(t, b.get("/operations/"+opID), http.StatusNotFound, "operation_not_found")
		require.Empty(t, b.accounts(), "b has no accounts")
		// b cannot refund a's order: to b it does not exist.
		r = b.post("/refunds", newKey(), map[string]any{"orderId": "A-1042", "amount": 1000})
		requireError(t, r, http.StatusNotFound, "order_not_found")

		// Order ids are per client: b may have an A-1042 of its own.
		ob := b.createOrder("A-1042", "cus_9", 700)
		require.Equal(t, int64(700), ob.Amount)
		require.Equal(t, int64(5000), a.getOrder("A-1042").Amount)
		require.Equal(t, "cus_9", b.getOrder("A-1042").CustomerID)

		a.requireBooks(5000, 1000)
		b.requireBooks(700, 0)
	})

	t.Run("KeysPerClient", func(t *testing.T) {
		a, b := a.in(t), b.in(t)
		key := newKey()
		body := map[string]any{"orderId": "K-1", "customerId": "cus_1", "amount": 300}
		ra := a.post("/orders", key, body)
		requireStatus(t, ra, http.StatusCreated)
		rb := b.post("/orders", key, body)
		requireStatus(t, rb, http.StatusCreated)
		require.Empty(t, rb.header.Get("Idempotent-Replayed"), "another client's key is not a replay")
		require.NotEqual(t, ra.header.Get("Operation-Id"), rb.header.Get("Operation-Id"), "two operations")
		require.Equal(t, key, a.getOperation(ra.header.Get("Operation-Id")).Key)
		require.Equal(t, key, b.getOperation(rb.header.Get("Operation-Id")).Key)

		// Each client's retry replays its own operation.
		r := b.post("/orders", key, body)
		requireStatus(t, r, http.StatusCreated)
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		require.Equal(t, rb.header.Get("Operation-Id"), r.header.Get("Operation-Id"))
	})
	d.stop()
}

// TestOrders checks POST /orders and GET /orders/{orderId}, and the answers to
// requests that no operation runs for.
func TestOrders(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	c := d.client(t, tokenA)

	t.Run("Create", func(t *testing.T) {
		c := c.in(t)
		key := newKey()
		r := c.post("/orders", key, map[string]any{"orderId": "A-1042", "customerId": "cus_1", "amount": 5000, "metadata": map[string]any{"note": "x"}})
		requireStatus(t, r, http.StatusCreated)
		require.JSONEq(t, `{"orderId": "A-1042", "customerId": "cus_1", "amount": 5000, "refunded": 0, "refunds": []}`, string(r.body))
		require.Empty(t, r.header.Get("Idempotent-Replayed"))
		opID := r.header.Get("Operation-Id")
		require.NoError(t, uuid.Validate(opID))

		got := c.get("/orders/A-1042")
		requireStatus(t, got, http.StatusOK)
		require.JSONEq(t, string(r.body), string(got.body))

		op := c.getOperation(opID)
		require.Equal(t, "order", op.Name)
		require.Equal(t, "succeeded", op.Status)
		require.Len(t, op.Steps, 1)
		require.Equal(t, "record", op.Steps[0].Name)
		require.Equal(t, "succeeded", op.Steps[0].Status)
		require.Empty(t, op.Steps[0].DerivedKey, "a database step has no derived key")

		// The same order under another key is a new operation, which fails.
		r = c.post("/orders", newKey(), map[string]any{"orderId": "A-1042", "customerId": "cus_1", "amount": 5000})
		requireError(t, r, http.StatusConflict, "order_exists")
		require.NotEmpty(t, r.header.Get("Operation-Id"))
		c.requireBooks(5000, 0)
	})

	t.Run("NotFound", func(t *testing.T) {
		c := c.in(t)
		requireError(t, c.get("/orders/nope"), http.StatusNotFound, "order_not_found")
	})

	t.Run("QuotedKey", func(t *testing.T) {
		c := c.in(t)
		key := newKey()
		body := map[string]any{"orderId": "Q-1", "customerId": "cus_2", "amount": 10}
		first := c.post("/orders", `"`+key+`"`, body)
		requireStatus(t, first, http.StatusCreated)
		again := c.post("/orders", key, body)
		requireStatus(t, again, http.StatusCreated)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.header.Get("Operation-Id"), again.header.Get("Operation-Id"))
		require.Equal(t, key, c.getOperation(first.header.Get("Operation-Id")).Key)
	})

	t.Run("Key", func(t *testing.T) {
		c := c.in(t)
		body := map[string]any{"orderId": "K-1", "customerId": "cus_1", "amount": 10}
		requireError(t, c.post("/orders", "", body), http.StatusBadRequest, "idempotency_key_missing")
		for _, key := range []string{strings.Repeat("k", 256), "has space", "tab\tkey", "é-key", `""`} {
			requireError(t, c.post("/orders", key, body), http.StatusBadRequest, "idempotency_key_invalid")
		}
		// A key of 255 characters is fine.
		requireStatus(t, c.post("/orders", strings.Repeat("k", 255), body), http.StatusCreated)
	})

	t.Run("Invalid", func(t *testing.T) {
		c := c.in(t)
		for _, tt := range []struct {
			name, body, param string
		}{
			{"MissingOrderID", `{"customerId": "cus_1", "amount": 10}`, "orderId"},
			{"EmptyOrderID", `{"orderId": "", "customerId": "cus_1", "amount": 10}`, "orderId"},
			{"OrderIDNotString", `{"orderId": 7, "customerId": "cus_1", "amount": 10}`, "orderId"},
			{"MissingCustomerID", `{"orderId": "V-1", "amount": 10}`, "customerId"},
			{"MissingAmount", `{"orderId": "V-1", "customerId": "cus_1"}`, "amount"},
			{"ZeroAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": 0}`, "amount"},
			{"NegativeAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": -5}`, "amount"},
			{"FractionalAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": 1.5}`, "amount"},
			{"StringAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": "10"}`, "amount"},
			{"MetadataNotObject", `{"orderId": "V-1", "customerId": "cus_1", "amount": 10, "metadata": [1]}`, "metadata"},
			{"UnknownField", `{"orderId": "V-1", "customerId": "cus_1", "amount": 10, "colour": "red"}`, "colour"},
			{"HugeAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": 100000000000000000000}`, "amount"},
			{"NullAmount", `{"orderId": "V-1", "customerId": "cus_1", "amount": null}`, "amount"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c := c.in(t)
				key := newKey()
				e := requireError(t, c.post("/orders", key, tt.body), http.StatusBadRequest, "invalid_request")
				require.Equal(t, tt.param, e.Param)
				// The key was not consumed: the corrected request runs under it.
				orderID := "V-" + key
				r := c.post("/orders", key, map[string]any{"orderId": orderID, "customerId": "cus_1", "amount": 10})
				requireStatus(t, r, http.StatusCreated)
				require.Empty(t, r.header.Get("Idempotent-Replayed"))
			})
		}
		for _, body := range []string{"", "not json", `[1, 2]`, `{"orderId": "V-1"`, `{"orderId": "V-1", "customerId": "cus_1", "amount": 10} {}`} {
			requireError(t, c.post("/orders", newKey(), body), http.StatusBadRequest, "invalid_request")
		}
	})

	t.Run("TooLarge", func(t *testing.T) {
		c := c.in(t)
		// sized returns an order's body of exactly n bytes.
		sized := func(orderID string, n int) string {
			head := `{"orderId": "` + orderID + `", "customerId": "cus_1", "amount": 10, "metadata": {"pad": "`
			tail := `"}}`
			return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
		}
		key := newKey()
		requireError(t, c.post("/orders", key, sized("L-1", 64<<10+1)), http.StatusRequestEntityTooLarge, "request_too_large")
		// Without a Content-Length too.
		requireError(t, c.post("/orders", key, io.MultiReader(strings.NewReader(sized("L-1", 1<<20)))), http.StatusRequestEntityTooLarge, "request_too_large")
		// The key was not consumed; 64 KiB is not too large.
		requireStatus(t, c.post("/orders", key, sized("L-1", 64<<10)), http.StatusCreated)
	})

	t.Run("OrderIDs", func(t *testing.T) {
		c := c.in(t)
		// Any 1 to 255 bytes without control characters, read back through the path.
		for _, id := range []string{"A 1/x?y#z%41", "ünïcødé", strings.Repeat("i", 255)} {
			o := c.createOrder(id, "cus_3", 1)
			require.Equal(t, id, o.OrderID)
			require.Equal(t, id, c.getOrder(id).OrderID)
		}
		for _, body := range []string{
			`{"orderId": "` + strings.Repeat("i", 256) + `", "customerId": "cus_1", "amount": 1}`,
			`{"orderId": "A\u0000B", "customerId": "cus_1", "amount": 1}`,
			`{"orderId": "A\nB", "customerId": "cus_1", "amount": 1}`,
		} {
			e := requireError(t, c.post("/orders", newKey(), body), http.StatusBadRequest, "invalid_request")
			require.Equal(t, "orderId", e.Param)
		}
	})

	t.Run("NotFoundAndMethods", func(t *testing.T) {
		c := c.in(t)
		// Errors outside the API's routes are JSON errors too.
		r := c.get("/nope")
		require.Equal(t, http.StatusNotFound, r.status)
		require.Equal(t, "application/json", r.header.Get("Content-Type"))
		errorOf(t, r)
		r = c.do(http.MethodDelete, "/orders/A-1042", "", nil)
		require.Equal(t, http.StatusMethodNotAllowed, r.status)
		require.Equal(t, "application/json", r.header.Get("Content-Type"))
		errorOf(t, r)
	})

	// The books of every order above: A-1042, Q-1, the long key's, one per
	// corrected invalid request, L-1, and the three of OrderIDs.
	c.requireBooks(5000+10+10+13*10+10+3, 0)
	d.stop()
}

// TestRefunds checks POST /refunds and its replays, its stored business errors,
// GET /refunds/{refundId} and GET /operations/{operationId}.
func TestRefunds(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	c := d.client(t, tokenA)
	c.createOrder("A-1042", "cus_1", 5000)

	key := newKey()
	body := `{"orderId": "A-1042", "amount": 1499, "metadata": {"reason": "damaged"}}`
	first := c.post("/refunds", key, body)
	requireStatus(t, first, http.StatusCreated)
	requireKeys(t, first.body, "refundId", "orderId", "amount", "status", "providerRefundId")
	ref := decodeAs[refundBody](t, first)
	require.True(t, strings.HasPrefix(ref.RefundID, "re_"), ref.RefundID)
	require.NotNil(t, ref.ProviderRefundID)
	require.True(t, strings.HasPrefix(*ref.ProviderRefundID, "pr_"), *ref.ProviderRefundID)
	require.Equal(t, refundBody{RefundID: ref.RefundID, OrderID: "A-1042", Amount: 1499, Status: "succeeded", ProviderRefundID: ref.ProviderRefundID}, ref)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	opID := first.header.Get("Operation-Id")

	t.Run("Replay", func(t *testing.T) {
		c := c.in(t)
		for _, again := range []string{
			body,
			`{"amount":1499,"orderId":"A-1042","metadata":{"reason":"damaged"}}`, // members reordered, no white space
			`{"orderId": "A-1042", "amount": 1499, "metadata": {"reason": "other"}}`,
			`{"orderId": "A-1042", "amount": 1499}`,
			`{"orderId": "A-1042", "amount": 1499, "metadata": null}`,
		} {
			r := c.post("/refunds", key, again)
			require.Equal(t, http.StatusCreated, r.status, "replay of %s: %s", again, r.body)
			require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
			require.Equal(t, string(first.body), string(r.body), "byte-identical")
			require.Equal(t, opID, r.header.Get("Operation-Id"))
		}
		// A quoted key is the same key.
		r := c.post("/refunds", `"`+key+`"`, body)
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, string(first.body), string(r.body))
	})

	t.Run("KeyReused", func(t *testing.T) {
		c := c.in(t)
		for _, tt := range []struct {
			path, body string
			fields     []string
		}{
			{"/refunds", `{"orderId": "A-1042", "amount": 1500}`, []string{"amount"}},
			{"/refunds", `{"orderId": "A-1042", "amount": 1500, "metadata": {"reason": "damaged"}}`, []string{"amount"}},
			{"/refunds", `{"orderId": "B-1", "amount": 1500}`, []string{"amount", "orderId"}},
			{"/orders", `{"orderId": "A-1042", "customerId": "cus_1", "amount": 1499}`, []string{"customerId", "path"}},
		} {
			r := c.post(tt.path, key, tt.body)
			e := requireError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
			require.Equal(t, tt.fields, e.MismatchedFields, "%s %s", tt.path, tt.body)
			require.Equal(t, opID, r.header.Get("Operation-Id"))
			require.Empty(t, r.header.Get("Idempotent-Replayed"))
		}
	})

	t.Run("GetRefund", func(t *testing.T) {
		c := c.in(t)
		r := c.get("/refunds/" + ref.RefundID)
		requireStatus(t, r, http.StatusOK)
		// The refund's answer, and whether the provider's webhook confirmed it.
		requireKeys(t, r.body, "refundId", "orderId", "amount", "status", "providerRefundId", "providerConfirmed")
		require.JSONEq(t, string(first.body), string(withoutMember(t, r.body, "providerConfirmed")))
		requireError(t, c.get("/refunds/re_NOPE"), http.StatusNotFound, "refund_not_found")
	})

	t.Run("Operation", func(t *testing.T) {
		c := c.in(t)
		r := c.get("/operations/" + opID)
		requireStatus(t, r, http.StatusOK)
		requireKeys(t, r.body, "operationId", "name", "version", "key", "status", "needsAttention", "createdAt", "finishedAt", "steps")
		op := decodeAs[operation](t, r)
		require.Equal(t, opID, op.OperationID)
		require.Equal(t, "refund", op.Name)
		require.Equal(t, key, op.Key)
		require.Equal(t, "succeeded", op.Status)
		require.NotNil(t, op.FinishedAt)
		require.False(t, op.FinishedAt.Before(op.CreatedAt))
		require.Len(t, op.Steps, 3)
		for i, name := range []string{"ledger", "provider", "finalize"} {
			st := op.Steps[i]
			require.Equal(t, name, st.Name)
			require.Equal(t, "succeeded", st.Status, "step %s", name)
			require.Equal(t, 1, st.Attempts, "step %s", name)
			require.NotNil(t, st.StartedAt, "step %s", name)
			require.NotNil(t, st.FinishedAt, "step %s", name)
			require.Nil(t, st.LastError, "step %s", name)
			if name == "provider" {
				require.NotEmpty(t, st.DerivedKey)
			} else {
				require.Empty(t, st.DerivedKey, "step %s calls nobody", name)
			}
		}
		// The provider got the derived key, once.
		refunds := c.providerRefunds()
		require.Len(t, refunds, 1)
		require.Equal(t, op.Steps[1].DerivedKey, refunds[0].IdempotencyKey)
		require.Equal(t, *ref.ProviderRefundID, refunds[0].ID)
		require.Equal(t, "A-1042", refunds[0].OrderID)
		require.Equal(t, int64(1499), refunds[0].Amount)
		require.Equal(t, 1, refunds[0].Requests)

		requireError(t, c.get("/operations/"+uuid.NewString()), http.StatusNotFound, "operation_not_found")
		requireError(t, c.get("/operations/not-a-uuid"), http.StatusNotFound, "operation_not_found")
	})

	// requireStoredFailure checks an answer that the ledger step rejected: stored,
	// replayed byte for byte, its operation failed with the later steps skipped.
	requireStoredFailure := func(t *testing.T, body string, status int, code string) {
		t.Helper()
		c := c.in(t)
		key := newKey()
		r := c.post("/refunds", key, body)
		requireError(t, r, status, code)
		opID := r.header.Get("Operation-Id")
		require.NoError(t, uuid.Validate(opID))
		again := c.post("/refunds", key, body)
		require.Equal(t, status, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, string(r.body), string(again.body))
		require.Equal(t, opID, again.header.Get("Operation-Id"))

		op := c.getOperation(opID)
		require.Equal(t, "failed", op.Status)
		require.NotNil(t, op.FinishedAt)
		require.Len(t, op.Steps, 3)
		require.Equal(t, "ledger", op.Steps[0].Name)
		require.Equal(t, "failed", op.Steps[0].Status)
		require.NotNil(t, op.Steps[0].LastError)
		for _, st := range op.Steps[1:] {
			require.Equal(t, "skipped", st.Status, "step %s", st.Name)
			require.Zero(t, st.Attempts, "step %s", st.Name)
		}
	}

	t.Run("OrderNotFound", func(t *testing.T) {
		requireStoredFailure(t, `{"orderId": "NOPE", "amount": 100}`, http.StatusNotFound, "order_not_found")
	})

	t.Run("AmountExceedsRefundable", func(t *testing.T) {
		c := c.in(t)
		requireStoredFailure(t, `{"orderId": "A-1042", "amount": 3502}`, http.StatusUnprocessableEntity, "amount_exceeds_refundable")
		// What is left can be refunded, then nothing more.
		r := c.post("/refunds", newKey(), `{"orderId": "A-1042", "amount": 3501}`)
		requireStatus(t, r, http.StatusCreated)
		requireStoredFailure(t, `{"orderId": "A-1042", "amount": 1}`, http.StatusUnprocessableEntity, "amount_exceeds_refundable")
	})

	// No rejected refund was recorded.
	o := c.getOrder("A-1042")
	require.Equal(t, int64(5000), o.Refunded)
	require.Len(t, o.Refunds, 2)
	require.Equal(t, ref.RefundID, o.Refunds[0].RefundID, "oldest first")
	require.Equal(t, int64(3501), o.Refunds[1].Amount)
	for _, r := range o.Refunds {
		require.Equal(t, "succeeded", r.Status)
		require.NotNil(t, r.ProviderRefundID)
	}
	require.Len(t, c.providerRefunds(), 2)
	accounts := c.requireBooks(5000, 5000)
	require.Equal(t, []account{{"customer:cus_1", 0}, {"merchant", 0}}, accounts)
	d.stop()
}

// TestProviderFaults makes the fake provider fail refund requests: the step is
// retried under its derived key until it succeeds, and the provider refunds once.
func TestProviderFaults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		mode string
		// attempts of the provider step: an error records nothing, so the third
		// attempt refunds; a lost answer recorded the refund, which the second
		// attempt finds by its key.
		attempts int
	}{
		{"error", 3},
		{"lost_response", 2},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			t.Parallel()
			d := startDemo(t, testdb.URL(t), nil)
			c := d.client(t, tokenA)
			c.createOrder("A-1", "cus_1", 5000)
			c.setFault(tt.mode, 2, 0)

			key := newKey()
			r := c.postUntilFinal("/refunds", key, map[string]any{"orderId": "A-1", "amount": 700})
			requireStatus(t, r, http.StatusCreated)
			ref := decodeAs[refundBody](t, r)
			require.Equal(t, "succeeded", ref.Status)

			op := c.getOperation(r.header.Get("Operation-Id"))
			require.Equal(t, "succeeded", op.Status)
			prov := op.Steps[1]
			require.Equal(t, "provider", prov.Name)
			require.Equal(t, "succeeded", prov.Status)
			require.Equal(t, tt.attempts, prov.Attempts)

			refunds := c.providerRefunds()
			require.Len(t, refunds, 1)
			require.Equal(t, prov.DerivedKey, refunds[0].IdempotencyKey)
			require.Equal(t, *ref.ProviderRefundID, refunds[0].ID)
			require.Equal(t, 1, refunds[0].Requests, "one request made the refund; no other counted")

			o := c.getOrder("A-1")
			require.Len(t, o.Refunds, 1)
			require.Equal(t, "succeeded", o.Refunds[0].Status)
			c.requireBooks(5000, 700)
			d.stop()
		})
	}
}

// TestDecline refunds an order that the provider declines: 402, stored and
// replayed, the ledger move reversed and the refund failed.
func TestDecline(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	c := d.client(t, tokenA)
	c.createOrder("DECLINE-1", "cus_1", 3000)
	before := c.requireBooks(3000, 0)

	// decline refunds amount of DECLINE-1 under a new key and checks the stored
	// 402 and the operation, whose provider step took attempts.
	decline := func(t *testing.T, amount int64, attempts int) {
		t.Helper()
		c := c.in(t)
		key := newKey()
		body := map[string]any{"orderId": "DECLINE-1", "amount": amount}
		r := c.post("/refunds", key, body)
		requireError(t, r, http.StatusPaymentRequired, "provider_declined")
		again := c.post("/refunds", key, body)
		require.Equal(t, http.StatusPaymentRequired, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, string(r.body), string(again.body))
		require.Equal(t, r.header.Get("Operation-Id"), again.header.Get("Operation-Id"))

		op := c.getOperation(r.header.Get("Operation-Id"))
		require.Equal(t, "failed", op.Status)
		var statuses []string
		for _, st := range op.Steps {
			statuses = append(statuses, st.Name+":"+st.Status)
		}
		require.Equal(t, []string{"ledger:compensated", "provider:failed", "finalize:skipped"}, statuses)
		require.Equal(t, attempts, op.Steps[1].Attempts)
		require.Equal(t, before, c.requireBooks(3000, 0), "the ledger is back where it was")
		require.Empty(t, c.providerRefunds(), "a decline records nothing at the provider")
	}

	t.Run("Declined", func(t *testing.T) {
		c := c.in(t)
		decline(t, 1000, 1)
		o := c.getOrder("DECLINE-1")
		require.Zero(t, o.Refunded)
		require.Len(t, o.Refunds, 1)
		require.Equal(t, "failed", o.Refunds[0].Status)
		require.Nil(t, o.Refunds[0].ProviderRefundID)
		got := c.getRefund(o.Refunds[0].RefundID)
		require.Equal(t, refundBody{RefundID: o.Refunds[0].RefundID, OrderID: "DECLINE-1", Amount: 1000, Status: "failed"}, got)
	})

	t.Run("AfterFaults", func(t *testing.T) {
		c := c.in(t)
		// Transient failures first, then the decline; a failed refund does not
		// count against what is left to refund, so the whole order may be asked.
		c.setFault("error", 1, 0)
		decline(t, 3000, 2)
		c.setFault("lost_response", 1, 0)
		decline(t, 3000, 2)
		o := c.getOrder("DECLINE-1")
		require.Len(t, o.Refunds, 3)
		for _, r := range o.Refunds {
			require.Equal(t, "failed", r.Status)
		}
	})
	d.stop()
}

// TestInProgress makes the provider slower than -wait: the first request answers
// 202, retries answer 409 until the operation finishes, then its answer.
func TestInProgress(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-wait", "300ms"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	c.setFault("slow", 1, 3000)

	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 250}
	r := c.post("/refunds", key, body)
	requireStatus(t, r, http.StatusAccepted)
	requireKeys(t, r.body, "operationId", "status")
	var accepted struct {
		OperationID string `json:"operationId"`
		Status      string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(r.body, &accepted))
	require.Equal(t, "in_progress", accepted.Status)
	require.Equal(t, accepted.OperationID, r.header.Get("Operation-Id"))
	require.Equal(t, "/operations/"+accepted.OperationID, r.header.Get("Location"))

	// The provider is still sleeping: the operation runs.
	op := c.getOperation(accepted.OperationID)
	require.Equal(t, "in_progress", op.Status)
	require.Nil(t, op.FinishedAt)
	require.Equal(t, "succeeded", op.Steps[0].Status)
	require.Contains(t, []string{"pending", "running"}, op.Steps[1].Status)
	require.Equal(t, "pending", op.Steps[2].Status)
	// The ledger moved the money; the refund is pending, and not yet refunded.
	o := c.getOrder("A-1")
	require.Zero(t, o.Refunded)
	require.Len(t, o.Refunds, 1)
	require.Equal(t, "pending", o.Refunds[0].Status)
	require.Nil(t, o.Refunds[0].ProviderRefundID)
	require.Equal(t, "pending", c.getRefund(o.Refunds[0].RefundID).Status)
	require.Equal(t, int64(5000-250), balance(c.accounts(), "merchant"))

	again := c.post("/refunds", key, body)
	requireError(t, again, http.StatusConflict, "request_in_progress")
	require.Equal(t, "1", again.header.Get("Retry-After"))
	require.Equal(t, accepted.OperationID, again.header.Get("Operation-Id"))
	// A different request under the key is still refused as one.
	reused := c.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 251})
	require.Equal(t, []string{"amount"}, requireError(t, reused, http.StatusUnprocessableEntity, "idempotency_key_reused").MismatchedFields)

	final := c.postUntilFinal("/refunds", key, body)
	requireStatus(t, final, http.StatusCreated)
	require.Equal(t, "true", final.header.Get("Idempotent-Replayed"))
	require.Equal(t, "succeeded", c.getOperation(accepted.OperationID).Status)
	require.Equal(t, "succeeded", c.getRefund(o.Refunds[0].RefundID).Status)
	c.requireBooks(5000, 250)
	d.stop()
}

// TestConcurrency sends refunds at once: of one order under many keys, which
// check what is left one after the other, and under one key, which run one
// operation.
func TestConcurrency(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	c := d.client(t, tokenA)
	const n = 10

	// sendAll sends n requests at once, with the key that keyFunc gives each,
	// and returns the answers.
	sendAll := func(t *testing.T, keyFunc func(i int) string, body any) []*response {
		c := c.in(t)
		answers := make([]*response, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i], errs[i] = c.send(http.MethodPost, "/refunds", keyFunc(i), body) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		return answers
	}

	t.Run("ManyKeys", func(t *testing.T) {
		c := c.in(t)
		c.createOrder("A-1", "cus_1", 1000)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = newKey()
		}
		answers := sendAll(t, func(i int) string { return keys[i] }, map[string]any{"orderId": "A-1", "amount": 300})
		succeeded := 0
		for _, r := range answers {
			if r.status == http.StatusCreated {
				succeeded++
				continue
			}
			requireError(t, r, http.StatusUnprocessableEntity, "amount_exceeds_refundable")
		}
		require.Equal(t, 3, succeeded, "300 fits three times into 1000")
		o := c.getOrder("A-1")
		require.Equal(t, int64(900), o.Refunded)
		require.Len(t, o.Refunds, 3)
		require.Len(t, c.providerRefunds(), 3)
	})

	t.Run("OneKey", func(t *testing.T) {
		c := c.in(t)
		c.createOrder("B-1", "cus_2", 1000)
		key := newKey()
		body := map[string]any{"orderId": "B-1", "amount": 250}
		answers := sendAll(t, func(int) string { return key }, body)
		var opIDs []string
		fresh := 0
		for _, r := range answers {
			opIDs = append(opIDs, r.header.Get("Operation-Id"))
			switch {
			case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
				fresh++
			case r.status != http.StatusCreated:
				requireError(t, r, http.StatusConflict, "request_in_progress")
			}
		}
		require.Equal(t, 1, fresh, "one request ran the operation; the others waited or replayed")
		require.Len(t, slices.Compact(opIDs), 1, "one operation: %v", opIDs)
		requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)
		o := c.getOrder("B-1")
		require.Equal(t, int64(250), o.Refunded)
		require.Len(t, o.Refunds, 1)
	})

	c.requireBooks(2000, 900+250)
	require.Len(t, c.providerRefunds(), 4)
	d.stop()
}
