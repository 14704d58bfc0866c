package main

// End-to-end tests of reconciliation (docs/demo-api.md, "Reconciliation"): the
// demo's books checked against the fake provider's records, on request and
// every -reconcile-interval. Each kind of mismatch is made on purpose (a
// refund planted at the provider, a refund paid after its operation failed,
// the provider's record changed behind the demo's back, an operator's word
// that the provider's record contradicts) and must name what it is about,
// draw attention to its refund and the gauge, and go once a run no longer
// finds it; refunds that ended well, however they got there, make none.

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// reconcileOnRequest is the flag that leaves reconciliation to POST
// /admin/reconciliation/run: no run comes between a test's steps.
var reconcileOnRequest = []string{"-reconcile-interval", "0"}

// mismatchKinds are the kinds of mismatch: the contract's, then the engine's.
var mismatchKinds = []string{"unknown_key", "not_succeeded", "amount_differs", "record_failed", "reference_differs", "missing_record"}

// reconciliationReport is the answer of GET /admin/reconciliation and of POST
// /admin/reconciliation/run.
type reconciliationReport struct {
	CheckedAt  *time.Time `json:"checkedAt"`
	Checked    int64      `json:"checked"`
	Mismatches []mismatch `json:"mismatches"`
	Total      int64      `json:"total"`
	Truncated  bool       `json:"truncated"`
}

// mismatch is one of a report's mismatches.
type mismatch struct {
	Kind             string    `json:"kind"`
	IdempotencyKey   string    `json:"idempotencyKey"`
	ProviderRefundID string    `json:"providerRefundId"`
	Amount           int64     `json:"amount"`
	OrderID          string    `json:"orderId"`
	Status           string    `json:"status"`
	OperationID      *string   `json:"operationId"`
	Client           *string   `json:"client"`
	OperationStatus  *string   `json:"operationStatus"`
	Detail           string    `json:"detail"`
	FirstSeen        time.Time `json:"firstSeen"`
	LastSeen         time.Time `json:"lastSeen"`
}

// reconciliation reads GET /admin/reconciliation.
func (d *demo) reconciliation(t *testing.T) reconciliationReport {
	t.Helper()
	return readReconciliation(t, d.admin(t, http.MethodGet, "/admin/reconciliation", ""))
}

// reconcile runs a reconciliation now: POST /admin/reconciliation/run, with
// a body ({}), which the route does not read (RunWithoutABody checks the
// POST without one).
func (d *demo) reconcile(t *testing.T) reconciliationReport {
	t.Helper()
	return readReconciliation(t, d.admin(t, http.MethodPost, "/admin/reconciliation/run", "{}"))
}

// readReconciliation requires a report with every member, each mismatch's
// included (null ones too), and decodes it.
func readReconciliation(t *testing.T, r *response) reconciliationReport {
	t.Helper()
	requireStatus(t, r, http.StatusOK)
	requireKeys(t, r.body, "checkedAt", "checked", "mismatches", "total", "truncated")
	var raw struct {
		Mismatches []json.RawMessage `json:"mismatches"`
	}
	require.NoError(t, json.Unmarshal(r.body, &raw))
	require.NotNil(t, raw.Mismatches, "mismatches must be [], not null: %s", r.body)
	for _, m := range raw.Mismatches {
		requireKeys(t, m, "kind", "idempotencyKey", "providerRefundId", "amount", "orderId", "status",
			"operationId", "client", "operationStatus", "detail", "firstSeen", "lastSeen")
	}
	rep := decodeAs[reconciliationReport](t, r)
	require.Equal(t, int64(len(rep.Mismatches)), rep.Total, "these tests make fewer than 1,000")
	require.False(t, rep.Truncated)
	for _, m := range rep.Mismatches {
		require.Contains(t, mismatchKinds, m.Kind)
		require.NotEmpty(t, m.Detail, "a mismatch says what differs: %+v", m)
		require.False(t, m.LastSeen.Before(m.FirstSeen), "lastSeen before firstSeen: %+v", m)
	}
	return rep
}

// only requires that the report has exactly one mismatch, and returns it.
func (rep reconciliationReport) only(t *testing.T) mismatch {
	t.Helper()
	require.Len(t, rep.Mismatches, 1, "mismatches: %+v", rep.Mismatches)
	return rep.Mismatches[0]
}

// requireNamesRefund requires that m names the refund operation id of the
// client, in the status given.
func requireNamesRefund(t *testing.T, m mismatch, id, client, status string) {
	t.Helper()
	require.NotNil(t, m.OperationID, "%+v", m)
	require.Equal(t, id, *m.OperationID)
	require.NotNil(t, m.Client, "%+v", m)
	require.Equal(t, client, *m.Client)
	require.NotNil(t, m.OperationStatus, "%+v", m)
	require.Equal(t, status, *m.OperationStatus)
}

// requireMismatchGauge requires idemflow_reconciliation_mismatches{kind} on
// GET /metrics to be want's count for every kind (0 for those it leaves out).
func requireMismatchGauge(t *testing.T, d *demo, want map[string]float64) {
	t.Helper()
	m := metricsOf(t, d)
	for _, kind := range mismatchKinds {
		series := `idemflow_reconciliation_mismatches{kind="` + kind + `"}`
		require.Contains(t, m, series)
		require.Equal(t, want[kind], m[series], series)
	}
}

// reconciledOp is GET /admin/operations/{id}, as far as these tests read it.
type reconciledOp struct {
	Status         string `json:"status"`
	NeedsAttention bool   `json:"needsAttention"`
	Attention      *struct {
		Code   string `json:"code"`
		Reason string `json:"reason"`
	} `json:"attention"`
	Steps []struct {
		Name       string `json:"name"`
		Status     string `json:"status"`
		DerivedKey string `json:"derivedKey"`
		ResolvedBy string `json:"resolvedBy"`
	} `json:"steps"`
}

// reconciledOp reads GET /admin/operations/{id}.
func (d *demo) reconciledOp(t *testing.T, id string) reconciledOp {
	t.Helper()
	r := d.admin(t, http.MethodGet, "/admin/operations/"+id, "")
	requireStatus(t, r, http.StatusOK)
	var op reconciledOp
	require.NoError(t, json.Unmarshal(r.body, &op), "body %s", r.body)
	return op
}

// providerKey is the derived key of the refund's provider step, as the admin
// JSON shows it.
func (op reconciledOp) providerKey(t *testing.T) string {
	t.Helper()
	for _, st := range op.Steps {
		if st.Name == "provider" {
			require.NotEmpty(t, st.DerivedKey)
			return st.DerivedKey
		}
	}
	t.Fatalf("no provider step: %+v", op.Steps)
	return ""
}

// requireAttention requires that the refund operation id needs attention
// (for its client and for operators, with the mismatch as why) or does not.
func requireAttention(t *testing.T, d *demo, c *apiClient, id string, want bool) {
	t.Helper()
	require.Equal(t, want, c.in(t).getOperation(id).NeedsAttention, "the client's needsAttention")
	op := d.reconciledOp(t, id)
	require.Equal(t, want, op.NeedsAttention, "the operators' needsAttention")
	if want {
		require.NotNil(t, op.Attention)
		require.EqualValues(t, "reconciliation_mismatch", op.Attention.Code)
	} else if op.Attention != nil {
		require.NotEqual(t, "reconciliation_mismatch", op.Attention.Code)
	}
	r := d.admin(t, http.MethodGet, "/admin/operations?needsAttention=true", "")
	requireStatus(t, r, http.StatusOK)
	var list struct {
		Operations []struct {
			OperationID string `json:"operationId"`
		} `json:"operations"`
	}
	require.NoError(t, json.Unmarshal(r.body, &list))
	listed := false
	for _, o := range list.Operations {
		listed = listed || o.OperationID == id
	}
	require.Equal(t, want, listed, "listed by GET /admin/operations?needsAttention=true: %s", r.body)
}

// requireSameReport requires that two reports say the same, times as instants.
func requireSameReport(t *testing.T, want, got reconciliationReport) {
	t.Helper()
	w, err := json.Marshal(want)
	require.NoError(t, err)
	g, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(w), string(g))
}

// plantRefund makes a refund at the fake provider directly, under key, as
// something outside the demo would: the demo holds no such key.
func plantRefund(t *testing.T, d *demo, key, orderID string, amount int64) (id, status string) {
	t.Helper()
	r := d.client(t, "").post("/provider/refunds", key, map[string]any{"orderId": orderID, "amount": amount})
	requireStatus(t, r, http.StatusOK)
	var pr struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(r.body, &pr), "body %s", r.body)
	require.True(t, strings.HasPrefix(pr.ID, "pr_"), pr.ID)
	return pr.ID, pr.Status
}

// dbExec runs a statement on the database at dbURL and returns the rows it
// changed.
func dbExec(t *testing.T, dbURL, query string, args ...any) int64 {
	t.Helper()
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, query, args...)
	require.NoError(t, err, "%s", query)
	return tag.RowsAffected()
}

// refundOK refunds amount of the order under a new key until it is final, and
// requires 201; it returns the operation's id.
func refundOK(t *testing.T, c *apiClient, orderID string, amount int64) string {
	t.Helper()
	r := c.in(t).postUntilFinal("/refunds", newKey(), map[string]any{"orderId": orderID, "amount": amount})
	requireStatus(t, r, http.StatusCreated)
	return r.header.Get("Operation-Id")
}

func TestReconciliation(t *testing.T) {
	t.Parallel()

	// A refund made at the provider under a key that no refund holds.
	t.Run("UnknownKey", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: reconcileOnRequest})

		before := d.reconciliation(t)
		require.Nil(t, before.CheckedAt, "no run yet")
		require.Zero(t, before.Checked)
		require.Empty(t, before.Mismatches)
		requireMismatchGauge(t, d, nil)

		prID, status := plantRefund(t, d, "outside-1", "X-1", 1234)
		require.Equal(t, "succeeded", status)
		// Its webhook event is the provider's record too: a mismatch at once.
		var atOnce reconciliationReport
		eventually(t, func() bool {
			atOnce = d.reconciliation(t)
			return len(atOnce.Mismatches) > 0
		}, "the planted refund's webhook made a mismatch")
		require.Nil(t, atOnce.CheckedAt)
		require.Equal(t, "unknown_key", atOnce.only(t).Kind)
		require.Equal(t, "outside-1", atOnce.only(t).IdempotencyKey)

		rep := d.reconcile(t)
		require.NotNil(t, rep.CheckedAt)
		require.EqualValues(t, 1, rep.Checked)
		m := rep.only(t)
		require.Equal(t, "unknown_key", m.Kind)
		require.Equal(t, "outside-1", m.IdempotencyKey)
		require.Equal(t, prID, m.ProviderRefundID)
		require.EqualValues(t, 1234, m.Amount)
		require.Equal(t, "X-1", m.OrderID)
		require.Equal(t, "succeeded", m.Status)
		require.Nil(t, m.OperationID)
		require.Nil(t, m.Client)
		require.Nil(t, m.OperationStatus)
		requireMismatchGauge(t, d, map[string]float64{"unknown_key": 1})
		requireSameReport(t, rep, d.reconciliation(t)) // GET answers what the run found

		// demo ops runs it too, with the demo's source, and prints the
		// report: exit status 1 for a mismatch.
		ops := demoOps(t, dbURL, "-provider-url", d.base+"/provider", "reconcile", "run")
		require.Equal(t, 1, ops.code, ops.stdout+ops.stderr)
		require.Contains(t, ops.stdout, "source provider: 1 record(s) made since ")
		require.Regexp(t, `provider\s+unknown_key\s+outside-1\s+`+prID+`\s+1234\s+succeeded\s+-`, ops.stdout)
		require.Contains(t, ops.stdout, "runbook for unknown_key: https://github.com/idemflow/idemflow/blob/main/docs/runbook.md#unknown_key\n")
		require.Contains(t, ops.stderr, "demo ops reconcile run: reconciliation mismatches: 1;")

		require.True(t, m.FirstSeen.Equal(atOnce.only(t).FirstSeen), "first seen by the event")

		// Seen again: the same mismatch, first seen when it was.
		again := d.reconcile(t).only(t)
		require.True(t, again.FirstSeen.Equal(m.FirstSeen), "firstSeen %s, then %s", m.FirstSeen, again.FirstSeen)
		require.False(t, again.LastSeen.Before(m.LastSeen))

		// The provider says after all that it moved nothing: a failed record
		// under an unknown key is in order, and the next run clears it.
		require.EqualValues(t, 1, dbExec(t, dbURL, `UPDATE provider.refund SET status = 'failed' WHERE idempotency_key = $1`, "outside-1"))
		cleared := d.reconcile(t)
		require.EqualValues(t, 1, cleared.Checked)
		require.Empty(t, cleared.Mismatches)
		requireMismatchGauge(t, d, nil)
		ops = demoOps(t, dbURL, "-provider-url", d.base+"/provider", "reconcile", "run")
		require.Equal(t, 0, ops.code, ops.stdout+ops.stderr)
		require.Contains(t, ops.stdout, "no reconciliation mismatches")
		d.stop()
	})

	// The provider paid a refund after its operation had failed: the request
	// landed later than -provider-settle promised. Its webhook makes the
	// mismatch at once, before any run.
	t.Run("NotSucceededFromTheWebhook", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		// Two attempts time out after 300 ms each; nothing is found 1 s after
		// the last, and the refund fails. The provider carries the first
		// request out 5 s after it came.
		d := startDemo(t, dbURL, &demoOpts{args: append([]string{"-provider-settle", "1s", "-provider-timeout", "300ms",
			"-max-attempts", "2"}, reconcileOnRequest...)})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		c.setFault("slow", 2, 5000)
		r := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700})
		requireError(t, r, http.StatusInternalServerError, "operation_failed")
		id := r.header.Get("Operation-Id")
		op := c.getOperation(id)
		require.Equal(t, "failed", op.Status)
		require.False(t, op.NeedsAttention, "nothing is known to be wrong yet")
		c.requireBooks(5000, 0)
		key := stepOf(t, op, "provider").DerivedKey

		var found mismatch
		eventually(t, func() bool {
			rep := d.reconciliation(t)
			if len(rep.Mismatches) == 0 {
				return false
			}
			require.Nil(t, rep.CheckedAt, "no run was asked for, and none runs on its own")
			found = rep.only(t)
			return true
		}, "the late refund's webhook made a mismatch")
		refunds := c.providerRefunds()
		require.Len(t, refunds, 1)
		require.Equal(t, key, refunds[0].IdempotencyKey)
		require.Equal(t, "not_succeeded", found.Kind)
		require.Equal(t, key, found.IdempotencyKey)
		require.Equal(t, refunds[0].ID, found.ProviderRefundID)
		require.EqualValues(t, 700, found.Amount)
		require.Equal(t, "A-1", found.OrderID)
		require.Equal(t, "succeeded", found.Status)
		requireNamesRefund(t, found, id, "merchant-a", "failed")
		requireAttention(t, d, c, id, true)

		// A run finds it too, and keeps it as it was first seen.
		rep := d.reconcile(t)
		require.NotNil(t, rep.CheckedAt)
		require.EqualValues(t, 1, rep.Checked)
		kept := rep.only(t)
		require.Equal(t, "not_succeeded", kept.Kind)
		require.Equal(t, key, kept.IdempotencyKey)
		requireNamesRefund(t, kept, id, "merchant-a", "failed")
		require.True(t, kept.FirstSeen.Equal(found.FirstSeen), "firstSeen %s, then %s", found.FirstSeen, kept.FirstSeen)
		requireMismatchGauge(t, d, map[string]float64{"not_succeeded": 1})
		requireAttention(t, d, c, id, true)

		// The provider reverses it (its record fails): in order, cleared by
		// the next run.
		require.EqualValues(t, 1, dbExec(t, dbURL, `UPDATE provider.refund SET status = 'failed' WHERE idempotency_key = $1`, key))
		require.Empty(t, d.reconcile(t).Mismatches)
		requireAttention(t, d, c, id, false)
		requireMismatchGauge(t, d, nil)
		d.stop()
	})

	// A refund that succeeded, whose record at the provider is then changed
	// behind the demo's back: its amount, its order, its status. Each is a
	// mismatch of the next run, and put back, none.
	t.Run("ProviderRecordChanged", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: reconcileOnRequest})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 700})
		requireStatus(t, r, http.StatusCreated)
		id, refundID := r.header.Get("Operation-Id"), decodeAs[refundBody](t, r).RefundID
		// Its webhook event is checked too, and clears what it finds in
		// order: it must be done before the record changes.
		eventually(t, func() bool { return c.getRefund(refundID).ProviderConfirmed }, "the refund's event applied")
		require.Empty(t, d.reconcile(t).Mismatches, "in order")
		requireAttention(t, d, c, id, false)
		key := d.reconciledOp(t, id).providerKey(t)
		prID := c.providerRefunds()[0].ID
		// Its event is applied: gone, it does not hold the record's id.
		require.EqualValues(t, 1, dbExec(t, dbURL, `DELETE FROM provider.webhook_event WHERE refund_id = $1`, prID))

		for _, tt := range []struct {
			name, change, undo string
			kind               string
			amount             int64
			orderID, status    string
			// id is the record's id, when the change gives it another.
			id string
		}{
			{"Amount", `SET amount = amount + 1`, `SET amount = amount - 1`, "amount_differs", 701, "A-1", "succeeded", ""},
			{"Order", `SET order_id = 'A-2'`, `SET order_id = 'A-1'`, "amount_differs", 700, "A-2", "succeeded", ""},
			{"Status", `SET status = 'failed'`, `SET status = 'succeeded'`, "record_failed", 700, "A-1", "failed", ""},
			// The refund succeeded by its call (not an operator's word):
			// its id is compared all the same.
			{"Reference", `SET id = 'pr_RENAMED'`, `SET id = '` + prID + `'`, "reference_differs", 700, "A-1", "succeeded", "pr_RENAMED"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				require.EqualValues(t, 1, dbExec(t, dbURL, `UPDATE provider.refund `+tt.change+` WHERE idempotency_key = $1`, key))
				m := d.reconcile(t).only(t)
				require.Equal(t, tt.kind, m.Kind)
				require.Equal(t, key, m.IdempotencyKey)
				if tt.id == "" {
					require.Equal(t, prID, m.ProviderRefundID)
				} else {
					require.Equal(t, tt.id, m.ProviderRefundID, "the provider's record's id")
					require.Contains(t, m.Detail, prID, "the books' id")
				}
				require.Equal(t, tt.amount, m.Amount)
				require.Equal(t, tt.orderID, m.OrderID)
				require.Equal(t, tt.status, m.Status)
				requireNamesRefund(t, m, id, "merchant-a", "succeeded")
				requireAttention(t, d, c, id, true)
				requireMismatchGauge(t, d, map[string]float64{tt.kind: 1})

				require.EqualValues(t, 1, dbExec(t, dbURL, `UPDATE provider.refund `+tt.undo+` WHERE idempotency_key = $1`, key))
				rep := d.reconcile(t)
				require.Empty(t, rep.Mismatches)
				requireSameReport(t, rep, d.reconciliation(t))
				requireAttention(t, d, c, id, false)
				requireMismatchGauge(t, d, nil)
			})
		}
		d.stop()
	})

	// An operator resolved a refund as made under a provider refund id that
	// the provider's record under the refund's key does not have.
	t.Run("ReferenceDiffers", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		p := startDemo(t, dbURL, &demoOpts{provider: true})
		proxy, down := switchableProvider(t, p.base+"/provider")
		// One attempt; the provider unreachable, so the refund waits past
		// its 1 s window for an operator.
		d := startDemo(t, dbURL, &demoOpts{args: append([]string{"-wait", "200ms", "-max-attempts", "1", "-retry-backoff", "30s",
			"-provider-timeout", "500ms", "-provider-settle", "1s", "-provider-url", proxy.URL}, reconcileOnRequest...)})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		down.Store(true)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		c.awaitOperation(id, pollInterval, "needing attention", needsAttention)
		requireStatus(t, d.admin(t, http.MethodPost, "/admin/operations/"+id+"/resolve",
			`{"outcome": "made", "providerRefundId": "pr_FROMTHEDASHBOARD", "reason": "seen in the provider's dashboard"}`), http.StatusOK)
		requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)

		// The provider turns out to hold another refund under the key.
		derived := d.reconciledOp(t, id).providerKey(t)
		prID, _ := plantRefund(t, p, derived, "A-1", 700)
		down.Store(false)
		m := d.reconcile(t).only(t)
		require.Equal(t, "reference_differs", m.Kind)
		require.Equal(t, derived, m.IdempotencyKey)
		require.Equal(t, prID, m.ProviderRefundID)
		require.Contains(t, m.Detail, "pr_FROMTHEDASHBOARD")
		requireNamesRefund(t, m, id, "merchant-a", "succeeded")
		requireAttention(t, d, c, id, true)
		requireMismatchGauge(t, d, map[string]float64{"reference_differs": 1})
		d.stop()
	})

	// An operator resolved a refund as made under a provider refund id while
	// the provider (its lookup too) was down; the provider never made it.
	// Once the refund's success is older than -provider-settle, a run finds
	// no record under its key: missing_record, naming the id the books hold.
	// Made after all, the next run clears it.
	t.Run("MissingRecord", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		p := startDemo(t, dbURL, &demoOpts{provider: true})
		proxy, down := switchableProvider(t, p.base+"/provider")
		d := startDemo(t, dbURL, &demoOpts{args: append([]string{"-wait", "200ms", "-max-attempts", "1", "-retry-backoff", "30s",
			"-provider-settle", "1s", "-provider-timeout", "500ms", "-provider-url", proxy.URL}, reconcileOnRequest...)})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 5000)
		down.Store(true)
		key := newKey()
		body := map[string]any{"orderId": "A-1", "amount": 700}
		id := requireAccepted(t, c.post("/refunds", key, body))
		c.awaitOperation(id, pollInterval, "needing attention", needsAttention)
		requireStatus(t, d.admin(t, http.MethodPost, "/admin/operations/"+id+"/resolve",
			`{"outcome": "made", "providerRefundId": "pr_MADEUP", "reason": "an operator's mistake"}`), http.StatusOK)
		requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)
		down.Store(false)
		derived := d.reconciledOp(t, id).providerKey(t)
		require.Empty(t, p.client(t, "").providerRefunds(), "the provider made nothing")

		var m mismatch
		eventually(t, func() bool {
			rep := d.reconcile(t)
			if len(rep.Mismatches) == 0 {
				return false // not yet -provider-settle old
			}
			m = rep.only(t)
			return true
		}, "a run finds the refund's record missing")
		require.Equal(t, "missing_record", m.Kind)
		require.Equal(t, derived, m.IdempotencyKey)
		require.Equal(t, "pr_MADEUP", m.ProviderRefundID, "the id the books hold")
		require.Contains(t, m.Detail, "pr_MADEUP")
		requireNamesRefund(t, m, id, "merchant-a", "succeeded")
		requireAttention(t, d, c, id, true)
		requireMismatchGauge(t, d, map[string]float64{"missing_record": 1})
		requireSameReport(t, d.reconcile(t), d.reconciliation(t))

		// The provider's record under the key after all (its id as the
		// operator said, found in another of its systems): in order.
		require.EqualValues(t, 1, dbExec(t, dbURL, `INSERT INTO provider.refund (id, idempotency_key, order_id, amount, reference)
			VALUES ('pr_MADEUP', $1, 'A-1', 700, 're_by_hand')`, derived))
		require.Empty(t, d.reconcile(t).Mismatches)
		requireAttention(t, d, c, id, false)
		requireMismatchGauge(t, d, nil)
		d.stop()
	})

	// Refunds that ended well however they got there, a failed one, a
	// declined one, one still pending, and a failed refund under a key of
	// nobody's: no mismatch.
	t.Run("NoFalseMismatches", func(t *testing.T) {
		t.Parallel()
		dbURL := testdb.URL(t)
		d := startDemo(t, dbURL, &demoOpts{args: append([]string{"-wait", "200ms", "-provider-timeout", "300ms",
			"-provider-settle", "20s", "-max-attempts", "3"}, reconcileOnRequest...)})
		c := d.client(t, tokenA)
		c.createOrder("A-1", "cus_1", 50000)
		c.createOrder("DECLINE-1", "cus_2", 1000)
		var ids []string

		ids = append(ids, refundOK(t, c, "A-1", 100))
		c.setFault("lost_response", 1, 0)
		ids = append(ids, refundOK(t, c, "A-1", 200))
		require.Equal(t, "lookup", stepOf(t, c.getOperation(ids[1]), "provider").ResolvedBy)
		c.setFault("error", 1, 0)
		ids = append(ids, refundOK(t, c, "A-1", 300))
		c.setFault("slow", 3, 1500) // every attempt times out; the refund lands later
		ids = append(ids, refundOK(t, c, "A-1", 400))
		require.Contains(t, []string{"lookup", "event"}, stepOf(t, c.getOperation(ids[3]), "provider").ResolvedBy)
		c.setPending(1, 100, "succeeded")
		ids = append(ids, refundOK(t, c, "A-1", 500))

		c.setPending(1, 100, "failed")
		failed := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 600})
		requireError(t, failed, http.StatusPaymentRequired, "provider_refund_failed")
		ids = append(ids, failed.header.Get("Operation-Id"))
		declined := c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "DECLINE-1", "amount": 100})
		requireError(t, declined, http.StatusPaymentRequired, "provider_declined")
		ids = append(ids, declined.header.Get("Operation-Id"))

		c.setPending(1, 100, "failed")
		_, status := plantRefund(t, d, "outside-failed", "X-1", 50)
		require.Equal(t, "pending", status)
		eventually(t, func() bool {
			return slices.ContainsFunc(c.providerRefunds(), func(pr providerRefund) bool {
				return pr.IdempotencyKey == "outside-failed" && pr.Status == "failed"
			})
		}, "the planted refund failed")

		// Pending for a minute: not judged while it is.
		c.setPending(1, 60000, "succeeded")
		pendingKey := newKey()
		pendingID := requireAccepted(t, c.post("/refunds", pendingKey, map[string]any{"orderId": "A-1", "amount": 700}))
		c.awaitOperation(pendingID, pollInterval, "the provider step waiting", func(op operation) bool {
			return stepOf(t, op, "provider").Status == "waiting"
		})
		awaitWebhooks(t, c)

		refunds := c.providerRefunds()
		require.Len(t, refunds, 8, "%+v", refunds) // 100 to 700 but the declined one, and the planted one
		require.True(t, slices.ContainsFunc(refunds, func(pr providerRefund) bool { return pr.Status == "pending" }))
		rep := d.reconcile(t)
		require.Empty(t, rep.Mismatches)
		require.EqualValues(t, len(refunds), rep.Checked, "every record was read")
		requireSameReport(t, rep, d.reconciliation(t))
		requireMismatchGauge(t, d, nil)
		for _, id := range ids {
			op := c.getOperation(id)
			require.NotEqual(t, "in_progress", op.Status)
			require.False(t, op.NeedsAttention, "operation %s", id)
		}
		require.Equal(t, "in_progress", c.getOperation(pendingID).Status)
		d.stop()
	})

	// With -reconcile-interval, runs come by themselves. The provider's
	// webhooks go nowhere, so only a run can find the planted refund.
	t.Run("Periodic", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-reconcile-interval", "1s",
			"-webhook-url", "http://" + closedPort(t) + "/webhooks/provider"}})
		prID, _ := plantRefund(t, d, "outside-periodic", "X-1", 99)
		var first reconciliationReport
		eventually(t, func() bool {
			first = d.reconciliation(t)
			return first.CheckedAt != nil && len(first.Mismatches) > 0
		}, "a run of its own found the planted refund")
		m := first.only(t)
		require.Equal(t, "unknown_key", m.Kind)
		require.Equal(t, "outside-periodic", m.IdempotencyKey)
		require.Equal(t, prID, m.ProviderRefundID)
		require.Nil(t, m.OperationID)
		eventually(t, func() bool {
			return metricsOf(t, d)[`idemflow_reconciliation_mismatches{kind="unknown_key"}`] == 1
		}, "the gauge counts it")

		// And the runs go on: a later one sees it again.
		eventually(t, func() bool {
			rep := d.reconciliation(t)
			if !rep.CheckedAt.After(*first.CheckedAt) {
				return false
			}
			again := rep.only(t)
			require.True(t, again.FirstSeen.Equal(m.FirstSeen))
			require.True(t, again.LastSeen.After(m.LastSeen), "seen again by the later run")
			return true
		}, "another run")
		d.stop()
	})

	t.Run("Auth", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), nil)
		routes := []struct{ method, path string }{
			{http.MethodGet, "/admin/reconciliation"},
			{http.MethodPost, "/admin/reconciliation/run"},
		}
		for _, rt := range routes {
			for _, auth := range []string{"", "Bearer " + tokenA, basicAuth("merchant-a", tokenA), "Bearer " + adminToken + "x"} {
				r := d.operatorRequest(t, rt.method, rt.path, auth, "")
				requireError(t, r, http.StatusUnauthorized, "unauthenticated")
			}
			for _, auth := range []string{"Bearer " + adminToken, basicAuth("ops", adminToken)} {
				readReconciliation(t, d.operatorRequest(t, rt.method, rt.path, auth, "{}"))
			}
		}
		for _, wrong := range []struct{ method, path string }{
			{http.MethodPost, "/admin/reconciliation"},
			{http.MethodDelete, "/admin/reconciliation"},
			{http.MethodGet, "/admin/reconciliation/run"},
			{http.MethodPut, "/admin/reconciliation/run"},
		} {
			requireError(t, d.admin(t, wrong.method, wrong.path, ""), http.StatusMethodNotAllowed, "method_not_allowed")
			// The token is checked first.
			requireError(t, d.operatorRequest(t, wrong.method, wrong.path, "", ""), http.StatusUnauthorized, "unauthenticated")
		}
		d.stop()
	})

	// POST /admin/reconciliation/run as curl -X POST sends it: no body.
	t.Run("RunWithoutABody", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), &demoOpts{args: reconcileOnRequest})
		rep := readReconciliation(t, d.admin(t, http.MethodPost, "/admin/reconciliation/run", ""))
		require.NotNil(t, rep.CheckedAt)
		d.stop()
	})

	// A browser that holds the admin token's Basic credentials, on another
	// site's page, cannot make the demo run one.
	t.Run("CrossOrigin", func(t *testing.T) {
		t.Parallel()
		d := startDemo(t, testdb.URL(t), &demoOpts{args: reconcileOnRequest})
		r := d.operatorRequest(t, http.MethodPost, "/admin/reconciliation/run", basicAuth("ops", adminToken), "{}",
			"Sec-Fetch-Site", "cross-site")
		requireError(t, r, http.StatusForbidden, "cross_origin_request")
		require.Nil(t, d.reconciliation(t).CheckedAt, "nothing ran")
		d.stop()
	})
}
