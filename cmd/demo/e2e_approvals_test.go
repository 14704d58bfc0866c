package main

// The contract's "Approvals" from the outside: refunds of version 3 of at
// least -approval-threshold wait for -approvals distinct operators
// (GET /admin/approvals, POST /admin/operations/{id}/approve and /reject,
// demo ops approve and reject), a rejection or an expiry reverses the ledger
// move and never asks the provider, and an approval or an expiry is carried
// out exactly once across a crash and across processes.

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// approvalItem is one refund of GET /admin/approvals.
type approvalItem struct {
	OperationID string     `json:"operationId"`
	Client      string     `json:"client"`
	OrderID     string     `json:"orderId"`
	Amount      int64      `json:"amount"`
	RequestedAt time.Time  `json:"requestedAt"`
	ExpiresAt   *time.Time `json:"expiresAt"`
	ApprovedBy  []string   `json:"approvedBy"`
}

// approvals reads GET /admin/approvals, which must have exactly the
// contract's fields.
func (d *demo) approvals(t *testing.T) []approvalItem {
	t.Helper()
	r := d.admin(t, http.MethodGet, "/admin/approvals", "")
	requireStatus(t, r, http.StatusOK)
	requireKeys(t, r.body, "approvals")
	body := decodeAs[struct {
		Approvals []approvalItem `json:"approvals"`
	}](t, r)
	require.NotNil(t, body.Approvals, "approvals must be [], not null")
	for _, a := range body.Approvals {
		require.NotNil(t, a.ApprovedBy, "approvedBy must be [], not null")
	}
	return body.Approvals
}

// approvalOf returns the item of the operation id in list.
func approvalOf(t *testing.T, list []approvalItem, id string) approvalItem {
	t.Helper()
	i := slices.IndexFunc(list, func(a approvalItem) bool { return a.OperationID == id })
	require.GreaterOrEqual(t, i, 0, "%s is not listed in %+v", id, list)
	return list[i]
}

// auditEntry is one entry of an operation's audit trail on /admin.
type auditEntry struct {
	At     time.Time `json:"at"`
	Action string    `json:"action"`
	Actor  string    `json:"actor"`
	Reason string    `json:"reason"`
	Result string    `json:"result"`
	Detail string    `json:"detail"`
}

// adminOperationOf decodes an answer in the shape of GET /admin/operations/{id}.
func adminOperationOf(t *testing.T, r *response) (adminOperation, []auditEntry) {
	t.Helper()
	requireStatus(t, r, http.StatusOK)
	var op adminOperation
	require.NoError(t, json.Unmarshal(r.body, &op), "body %s", r.body)
	var audit struct {
		Audit []auditEntry `json:"audit"`
	}
	require.NoError(t, json.Unmarshal(r.body, &audit), "body %s", r.body)
	return op, audit.Audit
}

// auditOf reads the operation's audit trail as "action actor reason result".
func (d *demo) auditOf(t *testing.T, id string) []string {
	t.Helper()
	_, audit := adminOperationOf(t, d.admin(t, http.MethodGet, "/admin/operations/"+id, ""))
	out := make([]string, len(audit))
	for i, a := range audit {
		out[i] = strings.Join([]string{a.Action, a.Actor, a.Reason, a.Result}, " ")
	}
	return out
}

// adminStep returns the step named name of op.
func adminStep(t *testing.T, op adminOperation, name string) string {
	t.Helper()
	for _, st := range op.Steps {
		if st.Name == name {
			return st.Status
		}
	}
	t.Fatalf("operation %s has no step %s", op.OperationID, name)
	return ""
}

// decide posts an approve or a reject with body to /admin.
func (d *demo) decide(t *testing.T, id, action, body string) *response {
	t.Helper()
	return d.admin(t, http.MethodPost, "/admin/operations/"+id+"/"+action, body)
}

// refundRequest is a refund request and its key.
type refundRequest struct {
	key  string
	body map[string]any
}

func newRefund(orderID string, amount int64) refundRequest {
	return refundRequest{key: newKey(), body: map[string]any{"orderId": orderID, "amount": amount}}
}

// postAccepted posts the refunds at once, each of which must outlast the
// demo's -wait, and returns their operation ids after their 202s.
func (c *apiClient) postAccepted(refunds ...refundRequest) []string {
	c.t.Helper()
	ids := make([]string, len(refunds))
	answers := make([]*response, len(refunds))
	errs := make([]error, len(refunds))
	var wg sync.WaitGroup
	for i, rf := range refunds {
		wg.Go(func() { answers[i], errs[i] = c.send(http.MethodPost, "/refunds", rf.key, rf.body) })
	}
	wg.Wait()
	for i := range refunds {
		require.NoError(c.t, errs[i])
		ids[i] = requireAccepted(c.t, answers[i])
	}
	return ids
}

// waitsForApproval is a condition of awaitOperation.
func waitsForApproval(op operation) bool {
	return op.Status != "in_progress" || slices.ContainsFunc(op.Steps, func(s step) bool { return s.Name == "approval" && s.Status == "waiting" })
}

// TestApprovals: with -approvals 2 and the default threshold, a smaller
// refund passes at once; larger ones wait, listed, until two distinct actors
// approved (the same actor twice counts once), or one rejected (422, the
// ledger move reversed, the provider never asked); every refusal is a 409 or
// a 400 with its code, never a 500, and every request is audited and counted.
func TestApprovals(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-refund-versions", "1,2,3", "-approvals", "2", "-wait", "3s"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 1_000_000)
	c.createOrder("A-2", "cus_2", 500_000)
	orderAnswer := c.post("/orders", newKey(), map[string]any{"orderId": "A-3", "customerId": "cus_3", "amount": 10})
	requireStatus(t, orderAnswer, http.StatusCreated)
	orderOp := orderAnswer.header.Get("Operation-Id")

	// Below -approval-threshold (100000): at once.
	r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 99_999})
	requireStatus(t, r, http.StatusCreated)
	require.NotNil(t, decodeAs[refundBody](t, r).Receipt)
	op := c.getOperation(r.header.Get("Operation-Id"))
	require.Equal(t, 3, op.Version)
	require.Equal(t, []string{"ledger:succeeded", "approval:succeeded", "provider:succeeded", "finalize:succeeded", "receipt:succeeded"}, stepStatuses(op))
	require.Empty(t, d.approvals(t))

	// One that waits for the provider's word (pending), not for approval: the
	// only one of these that asks the provider; and three at or above the
	// threshold, which wait for approval.
	c.setFault("pending", 1, 60_000)
	pending := newRefund("A-1", 10)
	approved, rejected, byOps := newRefund("A-1", 100_000), newRefund("A-2", 200_000), newRefund("A-1", 150_000)
	ids := c.postAccepted(pending, approved, rejected, byOps)
	pendingID, approvedID, rejectedID, byOpsID := ids[0], ids[1], ids[2], ids[3]
	c.awaitOperation(pendingID, pollInterval, "waiting on the provider", func(op operation) bool {
		return stepOf(t, op, "provider").Status == "waiting"
	})
	for _, id := range ids[1:] {
		op := c.awaitOperation(id, pollInterval, "waiting for approval", waitsForApproval)
		require.Equal(t, "in_progress", op.Status)
		require.False(t, op.NeedsAttention, "it waits for people, not for a repair")
		require.Equal(t, []string{"ledger:succeeded", "approval:waiting", "provider:pending", "finalize:pending", "receipt:pending"}, stepStatuses(op))
	}
	r = c.post("/refunds", approved.key, approved.body)
	requireError(t, r, http.StatusConflict, "request_in_progress")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, approvedID, r.header.Get("Operation-Id"))

	list := d.approvals(t)
	require.Len(t, list, 3)
	require.True(t, slices.IsSortedFunc(list, func(a, b approvalItem) int { return a.RequestedAt.Compare(b.RequestedAt) }), "oldest first: %+v", list)
	a := approvalOf(t, list, approvedID)
	require.Equal(t, approvalItem{OperationID: approvedID, Client: "merchant-a", OrderID: "A-1", Amount: 100_000,
		RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, ApprovedBy: []string{}}, a)
	require.NotNil(t, a.ExpiresAt)
	require.Equal(t, 72*time.Hour, a.ExpiresAt.Sub(a.RequestedAt), "the default -approval-timeout, from requestedAt")
	require.Equal(t, int64(200_000), approvalOf(t, list, rejectedID).Amount)
	eventually(t, func() bool {
		m := metricsOf(t, d)
		return m[`idemflow_operations_waiting{operation="refund",reason="approval"}`] == 3 &&
			m[`idemflow_operations_waiting{operation="refund",reason="outcome"}`] == 1
	}, "the waiting gauges count the refunds that wait for approval, and the one that waits for the provider")

	t.Run("Approve", func(t *testing.T) {
		// No reason: 400, nothing changed, audited as refused; a body that is
		// no request at all: 400, nothing recorded.
		for _, body := range []string{"", "{}", `{"actor": "ann"}`, `{"reason": "  "}`, `{"reason": null}`} {
			e := requireError(t, d.decide(t, approvedID, "approve", body), http.StatusBadRequest, "invalid_request")
			require.Equal(t, "reason", e.Param, "body %q", body)
		}
		e := requireError(t, d.decide(t, approvedID, "approve", `{"reason": 5}`), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "reason", e.Param)
		e = requireError(t, d.decide(t, approvedID, "approve", `{"reason": "ok", "force": true}`), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "force", e.Param)
		requireError(t, d.decide(t, approvedID, "approve", `[1]`), http.StatusBadRequest, "invalid_request")
		refusedNoReason := d.auditOf(t, approvedID)
		require.Len(t, refusedNoReason, 5, "each approval without a reason, audited")
		for _, a := range refusedNoReason {
			require.True(t, strings.HasPrefix(a, "approve ") && strings.HasSuffix(a, "  refused"), a)
		}

		// The first approval, then the same actor again: 200, still waiting.
		for range 2 {
			r := d.decide(t, approvedID, "approve", `{"reason": "checked the order", "actor": "ann"}`)
			require.Equal(t, approvedID, r.header.Get("Operation-Id"))
			op, _ := adminOperationOf(t, r)
			require.Equal(t, approvedID, op.OperationID)
			require.Equal(t, "merchant-a", op.Client)
			require.Equal(t, "in_progress", op.Status)
			require.Equal(t, "waiting", adminStep(t, op, "approval"))
		}
		require.Equal(t, []string{"approve ann checked the order done", "approve ann checked the order done"}, d.auditOf(t, approvedID)[5:])
		require.Equal(t, []string{"ann"}, approvalOf(t, d.approvals(t), approvedID).ApprovedBy)
		requireError(t, c.post("/refunds", approved.key, approved.body), http.StatusConflict, "request_in_progress")
		require.Equal(t, "waiting", stepOf(t, c.getOperation(approvedID), "approval").Status)

		// The second distinct actor: it goes on. The answer is the operation
		// as GET /admin/operations/{id} shows it.
		r := d.decide(t, approvedID, "approve", `{"reason": "fine by me", "actor": "bob"}`)
		requireStatus(t, r, http.StatusOK)
		var answered, read map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(r.body, &answered))
		require.NoError(t, json.Unmarshal(d.admin(t, http.MethodGet, "/admin/operations/"+approvedID, "").body, &read))
		require.ElementsMatch(t, slices.Collect(maps.Keys(read)), slices.Collect(maps.Keys(answered)))
		r = c.postUntilFinal("/refunds", approved.key, approved.body)
		requireStatus(t, r, http.StatusCreated)
		ref := decodeAs[refundBody](t, r)
		require.Equal(t, "succeeded", ref.Status)
		require.NotNil(t, ref.Receipt)
		made := 0
		for _, pr := range c.providerRefunds() {
			if pr.OrderID == "A-1" && pr.Amount == 100_000 {
				made++
			}
		}
		require.Equal(t, 1, made)
		for _, ap := range d.approvals(t) {
			require.NotEqual(t, approvedID, ap.OperationID)
		}

		// It ended: approving or rejecting it is refused.
		requireError(t, d.decide(t, approvedID, "approve", `{"reason": "me too", "actor": "carol"}`), http.StatusConflict, "operation_final")
		requireError(t, d.decide(t, approvedID, "reject", `{"reason": "too late", "actor": "carol"}`), http.StatusConflict, "operation_final")
		require.Equal(t, []string{
			"approve ann checked the order done", "approve ann checked the order done", "approve bob fine by me done",
			"approve carol me too refused", "reject carol too late refused",
		}, d.auditOf(t, approvedID)[5:])
	})

	t.Run("Reject", func(t *testing.T) {
		// No actor: "admin", as for the other operator requests on /admin.
		r := d.decide(t, rejectedID, "reject", `{"reason": "paid back by check"}`)
		requireStatus(t, r, http.StatusOK)
		r = c.postUntilFinal("/refunds", rejected.key, rejected.body)
		requireError(t, r, http.StatusUnprocessableEntity, "refund_rejected")
		require.Equal(t, rejectedID, r.header.Get("Operation-Id"))
		replay := c.post("/refunds", rejected.key, rejected.body)
		require.Equal(t, r.status, replay.status)
		require.Equal(t, string(r.body), string(replay.body))
		require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))

		op := c.getOperation(rejectedID)
		require.Equal(t, "failed", op.Status)
		require.Equal(t, []string{"ledger:compensated", "approval:failed", "provider:skipped", "finalize:skipped", "receipt:skipped"}, stepStatuses(op))
		o := c.getOrder("A-2")
		require.Len(t, o.Refunds, 1)
		require.Equal(t, "failed", o.Refunds[0].Status)
		require.Zero(t, o.Refunded)
		for _, pr := range c.providerRefunds() {
			require.NotEqual(t, "A-2", pr.OrderID, "the provider was never asked")
		}
		require.Equal(t, int64(1), dbCount(t, dbURL, `SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE order_id = 'A-2' AND kind = 'refund_reversal'`))
		require.Equal(t, int64(-500_000), balance(c.accounts(), "customer:cus_2"), "the ledger move was reversed")

		requireError(t, d.decide(t, rejectedID, "approve", `{"reason": "second thoughts", "actor": "ann"}`), http.StatusConflict, "operation_final")
		require.Equal(t, []string{"reject admin paid back by check done", "approve ann second thoughts refused"}, d.auditOf(t, rejectedID))
	})

	t.Run("DemoOps", func(t *testing.T) {
		listed := demoOps(t, dbURL, "approvals")
		require.Equal(t, 0, listed.code, listed.stderr)
		require.Contains(t, listed.stdout, byOpsID)
		res := demoOps(t, dbURL, "-actor", "dave", "approve", byOpsID, "looks", "right")
		require.Equal(t, 0, res.code, "stdout %s stderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stdout, "approved by dave (1 of 2)")
		res = demoOps(t, dbURL, "-actor", "erin", "approve", byOpsID, "ok")
		require.Equal(t, 0, res.code, "stdout %s stderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stdout, "it goes on")
		// The live demo resumes it.
		requireStatus(t, c.postUntilFinal("/refunds", byOps.key, byOps.body), http.StatusCreated)
		res = demoOps(t, dbURL, "reject", byOpsID, "too", "late")
		require.Equal(t, 1, res.code, "stdout %s stderr %s", res.stdout, res.stderr)
		require.Contains(t, res.stderr, "operation_final")
		res = demoOps(t, dbURL, "approve", byOpsID)
		require.Equal(t, 1, res.code, "no reason: %s", res.stderr)
		user := os.Getenv("USER")
		if user == "" {
			user = "operator"
		}
		require.Equal(t, []string{"approve dave looks right done", "approve erin ok done", "reject " + user + " too late refused",
			"approve " + user + "  refused"}, d.auditOf(t, byOpsID), "an approval without a reason is refused and audited")
	})

	t.Run("Refused", func(t *testing.T) {
		// In progress, but waiting for the provider, not for approval.
		for _, action := range []string{"approve", "reject"} {
			requireError(t, d.decide(t, pendingID, action, `{"reason": "why not"}`), http.StatusConflict, "not_awaiting_approval")
		}
		res := demoOps(t, dbURL, "approve", pendingID, "why", "not")
		require.Equal(t, 1, res.code)
		require.Contains(t, res.stderr, "not_awaiting_approval")
		require.Equal(t, "in_progress", c.getOperation(pendingID).Status)
		// An order, which ended without ever waiting for approval.
		requireError(t, d.decide(t, orderOp, "approve", `{"reason": "why not"}`), http.StatusConflict, "operation_final")
		// No such operation.
		requireError(t, d.decide(t, uuid.NewString(), "approve", `{"reason": "why not"}`), http.StatusNotFound, "operation_not_found")
		requireError(t, d.decide(t, "not-an-id", "reject", `{"reason": "why not"}`), http.StatusNotFound, "operation_not_found")
		// The admin token only, and POST only.
		r := d.operatorRequest(t, http.MethodPost, "/admin/operations/"+pendingID+"/approve", "Bearer "+tokenA, `{"reason": "x"}`)
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		r = d.operatorRequest(t, http.MethodGet, "/admin/approvals", "", "")
		requireError(t, r, http.StatusUnauthorized, "unauthenticated")
		requireError(t, d.admin(t, http.MethodGet, "/admin/operations/"+pendingID+"/approve", ""), http.StatusMethodNotAllowed, "method_not_allowed")
		requireError(t, d.admin(t, http.MethodPost, "/admin/approvals", ""), http.StatusMethodNotAllowed, "method_not_allowed")
	})

	m := metricsOf(t, d)
	require.Equal(t, 3.0, m[`idemflow_operator_requests_total{action="approve",result="done"}`], "ann, ann again, bob")
	require.Equal(t, 1.0, m[`idemflow_operator_requests_total{action="reject",result="done"}`])
	require.Equal(t, 9.0, m[`idemflow_operator_requests_total{action="approve",result="refused"}`], "five without a reason, carol, ann on the rejected one, the pending one, the order")
	require.Equal(t, 2.0, m[`idemflow_operator_requests_total{action="reject",result="refused"}`])
	// The orders less the refunds that moved money: 99,999, the pending 10,
	// 100,000 and 150,000; the rejected one was given back.
	accounts := c.accounts()
	require.Equal(t, int64(1_500_010-99_999-10-100_000-150_000), balance(accounts, "merchant"), "%+v", accounts)
}

// TestApprovalsCrash: an approval that commits just before the demo is
// killed (it is frozen with SIGSTOP, approved with demo ops, then killed with
// SIGKILL, so that it cannot have acted on it) is carried out by the next
// process, exactly once: one provider refund, one ledger move.
func TestApprovalsCrash(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	args := []string{"-refund-versions", "3", "-wait", "500ms"}
	d := startDemo(t, dbURL, &demoOpts{args: args})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 500_000)
	rf := newRefund("A-1", 300_000)
	id := c.postAccepted(rf)[0]
	c.awaitOperation(id, pollInterval, "waiting for approval", waitsForApproval)

	if err := freezeProcess(d.cmd.Process); errors.Is(err, errors.ErrUnsupported) {
		t.Skip("no SIGSTOP here")
	} else {
		require.NoError(t, err)
	}
	res := demoOps(t, dbURL, "-actor", "ann", "approve", id, "approved", "before", "the", "crash")
	require.Equal(t, 0, res.code, "stdout %s stderr %s", res.stdout, res.stderr)
	require.Contains(t, res.stdout, "it goes on")
	d.kill()
	require.Equal(t, int64(1), dbCount(t, dbURL, `SELECT count(*) FROM demo_refund WHERE order_id = 'A-1' AND status = 'pending'`),
		"the killed demo did not finish the refund")

	d = startDemo(t, dbURL, &demoOpts{args: args})
	c = d.client(t, tokenA)
	r := c.postUntilFinal("/refunds", rf.key, rf.body)
	requireStatus(t, r, http.StatusCreated)
	require.Equal(t, "succeeded", decodeAs[refundBody](t, r).Status)
	refunds := c.providerRefunds()
	require.Len(t, refunds, 1, "%+v", refunds)
	require.Equal(t, 1, refunds[0].Requests, "the provider was asked once")
	require.Equal(t, int64(300_000), refunds[0].Amount)
	require.Equal(t, int64(1), dbCount(t, dbURL, `SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE kind = 'refund'`))
	require.Zero(t, dbCount(t, dbURL, `SELECT count(*) FROM demo_ledger_entry WHERE kind = 'refund_reversal'`))
	c.requireBooks(500_000, 300_000)
	require.Equal(t, []string{"approve ann approved before the crash done"}, d.auditOf(t, id))
	require.Empty(t, d.approvals(t))
}

// TestApprovalsExpire: a refund whose approvals never come expires exactly
// once, carried out by two processes that both start after its moment (none
// ran then): 422 approval_expired, one reversal of its ledger move, the
// provider never asked; an approval after the moment is refused.
func TestApprovalsExpire(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	args := []string{"-refund-versions", "3", "-wait", "500ms", "-approval-timeout", "4s"}
	d := startDemo(t, dbURL, &demoOpts{args: args})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 500_000)
	rf := newRefund("A-1", 200_000)
	id := c.postAccepted(rf)[0]
	c.awaitOperation(id, pollInterval, "waiting for approval", waitsForApproval)
	a := approvalOf(t, d.approvals(t), id)
	require.NotNil(t, a.ExpiresAt)
	require.Equal(t, 4*time.Second, a.ExpiresAt.Sub(a.RequestedAt))
	d.stop()
	require.Equal(t, int64(1), dbCount(t, dbURL, `SELECT count(*) FROM demo_refund WHERE order_id = 'A-1' AND status = 'pending'`),
		"the demo stopped after the refund expired: make -approval-timeout longer")

	// No process runs at the moment; an approval after it is refused.
	time.Sleep(time.Until(*a.ExpiresAt) + 500*time.Millisecond)
	res := demoOps(t, dbURL, "-actor", "ann", "approve", id, "late")
	require.Equal(t, 1, res.code, "stdout %s stderr %s", res.stdout, res.stderr)
	require.Contains(t, res.stderr, "operation_final")

	// Two processes start after the moment, on the same database.
	d1 := startDemo(t, dbURL, &demoOpts{args: args, noWait: true})
	d2 := startDemo(t, dbURL, &demoOpts{args: args, noWait: true})
	d1.waitListening()
	d2.waitListening()
	c1, c2 := d1.client(t, tokenA), d2.client(t, tokenA)
	r := c1.postUntilFinal("/refunds", rf.key, rf.body)
	requireError(t, r, http.StatusUnprocessableEntity, "approval_expired")
	replay := c2.post("/refunds", rf.key, rf.body)
	require.Equal(t, string(r.body), string(replay.body))
	require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
	requireError(t, d2.decide(t, id, "reject", `{"reason": "too late", "actor": "bob"}`), http.StatusConflict, "operation_final")

	require.Equal(t, int64(1), dbCount(t, dbURL, `SELECT count(DISTINCT move_id) FROM demo_ledger_entry WHERE kind = 'refund_reversal'`), "one reversal")
	require.Equal(t, int64(2), dbCount(t, dbURL, `SELECT count(*) FROM demo_ledger_entry WHERE kind = 'refund_reversal'`))
	o := c1.getOrder("A-1")
	require.Len(t, o.Refunds, 1)
	require.Equal(t, "failed", o.Refunds[0].Status)
	require.Empty(t, c1.providerRefunds(), "the provider was never asked")
	c1.requireBooks(500_000, 0)
	op := c2.getOperation(id)
	require.Equal(t, []string{"ledger:compensated", "approval:failed", "provider:skipped", "finalize:skipped", "receipt:skipped"}, stepStatuses(op))
	require.Equal(t, []string{"approve ann late refused", "reject bob too late refused"}, d1.auditOf(t, id))
	require.Empty(t, d2.approvals(t))
}
