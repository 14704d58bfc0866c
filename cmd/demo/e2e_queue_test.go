package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// queueMessage is the answer of GET /queue/orders/{messageId}.
type queueMessage struct {
	MessageID   string  `json:"messageId"`
	Status      string  `json:"status"`
	Deliveries  int     `json:"deliveries"`
	OperationID *string `json:"operationId"`
	Error       *string `json:"error"`
}

// enqueue posts a queued order and requires 202.
func (c *apiClient) enqueue(messageID, orderID, customerID string, amount int64) {
	c.t.Helper()
	r := c.post("/queue/orders", "", map[string]any{"messageId": messageID, "orderId": orderID, "customerId": customerID, "amount": amount})
	requireStatus(c.t, r, http.StatusAccepted)
	require.JSONEq(c.t, `{"messageId": "`+messageID+`"}`, string(r.body))
}

func (c *apiClient) queueMessage(messageID string) queueMessage {
	c.t.Helper()
	r := c.get("/queue/orders/" + url.PathEscape(messageID))
	requireStatus(c.t, r, http.StatusOK)
	requireKeys(c.t, r.body, "messageId", "status", "deliveries", "operationId", "error")
	return decodeAs[queueMessage](c.t, r)
}

// awaitMessage polls the message until cond holds, and returns it.
func (c *apiClient) awaitMessage(messageID string, cond func(queueMessage) bool) queueMessage {
	c.t.Helper()
	var m queueMessage
	eventually(c.t, func() bool { m = c.queueMessage(messageID); return cond(m) }, "message %s: last %+v", messageID, &m)
	return m
}

// orderMoves counts the ledger moves of the client's order.
func orderMoves(t *testing.T, dbURL, client, orderID string) int64 {
	t.Helper()
	return dbCount(t, dbURL, "SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE client = $1 AND order_id = $2 AND kind = 'order'", client, orderID)
}

// TestQueue: orders that arrive as queued messages, delivered several times
// at once, again by the producer, after crashes, and with another body under
// the same id, are each created once.
func TestQueue(t *testing.T) {
	t.Parallel()

	t.Run("OnceHoweverDelivered", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{env: []string{"DEMO_QUEUE_DUPLICATES=5"}})
		c := d.client(t, tokenA)
		c.enqueue("m-1", "A-1", "cus_1", 5000)
		m := c.awaitMessage("m-1", func(m queueMessage) bool { return m.Status == "done" && m.Deliveries == 6 })
		require.Nil(t, m.Error)
		require.NotNil(t, m.OperationID)
		o := c.getOrder("A-1")
		require.Equal(t, int64(5000), o.Amount)
		c.requireBooks(5000, 0)

		op := c.getOperation(*m.OperationID)
		require.Equal(t, "order", op.Name)
		require.Equal(t, "m-1", op.Key)
		require.Equal(t, "succeeded", op.Status)
		requireError(t, d.client(t, tokenB).get("/operations/"+*m.OperationID), http.StatusNotFound, "operation_not_found")
		requireError(t, d.client(t, tokenB).get("/queue/orders/m-1"), http.StatusNotFound, "message_not_found")

		// The producer sends it again: six more deliveries, no effect.
		c.enqueue("m-1", "A-1", "cus_1", 5000)
		m = c.awaitMessage("m-1", func(m queueMessage) bool { return m.Deliveries == 12 })
		require.Equal(t, "done", m.Status)
		require.EqualValues(t, 1, orderMoves(t, dbURL, "merchant-a", "A-1"))
		require.EqualValues(t, 1, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_operation WHERE scope = 'queue:merchant-a'"))
		c.requireBooks(5000, 0)

		// Another client's message of the same id is its own.
		b := d.client(t, tokenB)
		b.enqueue("m-1", "A-1", "cus_9", 700)
		b.awaitMessage("m-1", func(m queueMessage) bool { return m.Status == "done" })
		b.requireBooks(700, 0)
	})

	t.Run("OtherBodySameID", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: []string{"-queue-duplicates", "2"}})
		c := d.client(t, tokenA)
		c.enqueue("m-2", "A-2", "cus_1", 100)
		first := c.awaitMessage("m-2", func(m queueMessage) bool { return m.Status == "done" })
		c.enqueue("m-2", "A-2", "cus_1", 200)
		m := c.awaitMessage("m-2", func(m queueMessage) bool { return m.Status == "rejected" && m.Deliveries == 6 })
		require.NotNil(t, m.Error)
		require.Contains(t, *m.Error, "amount")
		require.Equal(t, first.OperationID, m.OperationID, "the first message's operation holds the id")
		require.Equal(t, int64(100), c.getOrder("A-2").Amount)
		require.EqualValues(t, 1, orderMoves(t, dbURL, "merchant-a", "A-2"))
		c.requireBooks(100, 0)
		// The rejected jobs were cancelled, never to be retried.
		eventually(t, func() bool {
			return dbCount(t, dbURL, "SELECT count(*) FROM river_job WHERE kind = 'demo_queue_order' AND state = 'cancelled'") == 3
		}, "three cancelled jobs")
	})

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), nil)
		c := d.client(t, tokenA)
		for _, tc := range []struct{ body, param string }{
			{`{"orderId": "A-1", "customerId": "c", "amount": 1}`, "messageId"},
			{`{"messageId": "", "orderId": "A-1", "customerId": "c", "amount": 1}`, "messageId"},
			{`{"messageId": "m", "customerId": "c", "amount": 1}`, "orderId"},
			{`{"messageId": "m", "orderId": "A-1", "amount": 1}`, "customerId"},
			{`{"messageId": "m", "orderId": "A-1", "customerId": "c", "amount": 0}`, "amount"},
			{`{"messageId": "m", "orderId": "A-1", "customerId": "c", "amount": 1, "extra": 1}`, "extra"},
		} {
			e := requireError(t, c.post("/queue/orders", "", tc.body), http.StatusBadRequest, "invalid_request")
			require.Equal(t, tc.param, e.Param, tc.body)
		}
		requireError(t, c.post("/queue/orders", "", `[1]`), http.StatusBadRequest, "invalid_request")
		requireError(t, c.post("/queue/orders", "", strings.Repeat(" ", 70<<10)), http.StatusRequestEntityTooLarge, "request_too_large")
		requireError(t, d.client(t, "").post("/queue/orders", "", `{}`), http.StatusUnauthorized, "unauthenticated")
		requireError(t, c.get("/queue/orders/nope"), http.StatusNotFound, "message_not_found")
		requireError(t, c.do(http.MethodDelete, "/queue/orders/nope", "", nil), http.StatusMethodNotAllowed, "method_not_allowed")
	})

	// The demo dies in the job's transaction, after the operation's start and
	// before the commit that completes the job: nothing committed. The
	// producer's redelivery creates the order; the stuck delivery, once River
	// rescues it, finds the operation and does nothing.
	t.Run("CrashBeforeTheAcknowledgement", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{crash: "consume:after-effect"})
		c := d.client(t, tokenA)
		// The job that the message's commit wakes may crash the demo before
		// the 202 reaches the client: a cut connection then, after that
		// commit (the stuck delivery below is its job).
		if r, err := c.send(http.MethodPost, "/queue/orders", "", map[string]any{"messageId": "m-3", "orderId": "A-3", "customerId": "cus_1", "amount": 300}); err == nil {
			requireStatus(t, r, http.StatusAccepted)
		}
		require.Equal(t, crashExitCode, d.waitExit(), "exit status of DEMO_CRASH")
		require.Contains(t, d.stderr.String(), "DEMO_CRASH")

		stuck := stuckJobs(t, dbURL)
		require.Len(t, stuck, 1, "the delivery that the crash cut")
		d = startDemo(t, dbURL, nil)
		c = d.client(t, tokenA)
		require.Equal(t, "pending", c.queueMessage("m-3").Status, "nothing of the delivery committed")
		require.Zero(t, dbCount(t, dbURL, "SELECT count(*) FROM idemflow_operation WHERE scope = 'queue:merchant-a'"))
		c.enqueue("m-3", "A-3", "cus_1", 300)
		c.awaitMessage("m-3", func(m queueMessage) bool { return m.Status == "done" && m.Deliveries == 1 })

		// River's rescuer makes a job that has run for too long available
		// again (after an hour, by default): done here by hand.
		rescue(t, dbURL, stuck)
		c.awaitMessage("m-3", func(m queueMessage) bool { return m.Deliveries == 2 })
		require.EqualValues(t, 1, orderMoves(t, dbURL, "merchant-a", "A-3"))
		c.requireBooks(300, 0)
	})

	// SIGKILL while the messages and their copies are being consumed: each
	// delivery's operation start and the job's completion commit together or
	// not at all, so every order is created once when the deliveries left are
	// worked by the demo started after, those it left running included.
	t.Run("KilledWhileConsuming", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: []string{"-queue-duplicates", "3"}})
		c := d.client(t, tokenA)
		const n = 20
		for i := range n {
			c.enqueue(fmt.Sprintf("m-%d", i), fmt.Sprintf("A-%d", i), "cus_1", 100)
		}
		// Killed once consuming has begun.
		eventually(t, func() bool {
			return dbCount(t, dbURL, "SELECT coalesce(sum(deliveries), 0) FROM demo_queue_message") > 0
		}, "a delivery")
		d.kill()
		stuck := stuckJobs(t, dbURL)
		t.Logf("killed with %d deliveries running, %d of %d consumed", len(stuck),
			dbCount(t, dbURL, "SELECT sum(deliveries) FROM demo_queue_message"), 4*n)

		d = startDemo(t, dbURL, nil)
		c = d.client(t, tokenA)
		rescue(t, dbURL, stuck)
		for i := range n {
			m := c.awaitMessage(fmt.Sprintf("m-%d", i), func(m queueMessage) bool { return m.Status == "done" && m.Deliveries == 4 })
			require.Nil(t, m.Error)
			require.EqualValues(t, 1, orderMoves(t, dbURL, "merchant-a", fmt.Sprintf("A-%d", i)))
		}
		c.requireBooks(n*100, 0)
	})
}

// stuckJobs returns the queued orders' jobs that a killed process left
// running (read before another process starts).
func stuckJobs(t *testing.T, dbURL string) []int64 {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, "SELECT id FROM river_job WHERE kind = 'demo_queue_order' AND state = 'running'")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// rescue does to the jobs ids what River's rescuer does to a job that has been
// running longer than RescueStuckJobsAfter (an hour by default): it makes them
// available again.
func rescue(t *testing.T, dbURL string, ids []int64) {
	t.Helper()
	dbCount(t, dbURL, `WITH rescued AS (
		UPDATE river_job SET state = 'available', scheduled_at = now()
		WHERE id = ANY($1) AND state = 'running' RETURNING 1
	) SELECT count(*) FROM rescued`, ids)
}
