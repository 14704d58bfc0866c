package opsweb_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// approval is an operation of GET /admin/approvals.
type approval struct {
	OperationID string     `json:"operationId"`
	Client      string     `json:"client"`
	Name        string     `json:"name"`
	Version     int        `json:"version"`
	Key         string     `json:"key"`
	Step        string     `json:"step"`
	RequestedAt time.Time  `json:"requestedAt"`
	ExpiresAt   *time.Time `json:"expiresAt"`
	Need        int        `json:"need"`
	ApprovedBy  []string   `json:"approvedBy"`
}

// startPayout starts a payout and returns its id once it waits at its
// approval step (with in.Halt, once it is parked).
func (b *bundle) startPayout(scope, key string, in payoutIn) uuid.UUID {
	b.t.Helper()
	started, err := engine.Start(b.t.Context(), b.e, b.payout, scope, key, in, nil)
	require.NoError(b.t, err)
	if in.Halt {
		require.True(b.t, idemflowtest.Wait(b.t, b.e, started).Parked)
		return started.ID
	}
	require.Eventually(b.t, func() bool {
		info, err := b.e.Get(b.t.Context(), started.ID)
		require.NoError(b.t, err)
		return info.Steps[1].Status == engine.StepStatusWaiting
	}, 30*time.Second, 10*time.Millisecond, "payout %s never waited for approval", started.ID)
	return started.ID
}

func (b *bundle) approvals(query string) []approval {
	b.t.Helper()
	body := decode[struct {
		Approvals []approval `json:"approvals"`
	}](b.t, b.admin(http.MethodGet, "/admin/approvals"+query, ""))
	require.NotNil(b.t, body.Approvals, "approvals must be [], not null")
	return body.Approvals
}

func TestApprovalsAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.Empty(t, b.approvals(""))
	requireError(t, b.admin(http.MethodGet, "/admin/approvals?limit=0", ""), http.StatusBadRequest, "invalid_request")
	e := requireError(t, b.admin(http.MethodGet, "/admin/approvals?status=failed", ""), http.StatusBadRequest, "invalid_request")
	require.Equal(t, "status", e.Param)
	requireError(t, b.admin(http.MethodPost, "/admin/approvals", ""), http.StatusMethodNotAllowed, "method_not_allowed")

	two := b.startPayout("client-a", "k-two", payoutIn{Need: 2, Expires: time.Hour})
	one := b.startPayout("client-b", "k-one", payoutIn{Need: 1})
	path := func(id uuid.UUID, action string) string { return "/admin/operations/" + id.String() + "/" + action }

	t.Run("List", func(t *testing.T) {
		list := b.approvals("")
		require.Len(t, list, 2)
		require.Equal(t, []string{two.String(), one.String()}, []string{list[0].OperationID, list[1].OperationID}, "oldest first")
		a := list[0]
		require.Equal(t, approval{OperationID: two.String(), Client: "client-a", Name: "payout", Version: 1, Key: "k-two", Step: "approval",
			RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, Need: 2, ApprovedBy: []string{}}, a)
		require.NotNil(t, a.ExpiresAt)
		require.WithinDuration(t, a.RequestedAt.Add(time.Hour), *a.ExpiresAt, time.Second, "expires an hour after it was requested (each by the database's clock)")
		require.Nil(t, list[1].ExpiresAt, "never expires")
		require.Len(t, b.approvals("?limit=1"), 1)
	})
	t.Run("OperationWaits", func(t *testing.T) {
		op := decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+two.String(), ""))
		require.Equal(t, "in_progress", op.Status)
		require.False(t, op.NeedsAttention, "it waits for people, not for a repair")
		st := op.Steps[1]
		require.Equal(t, "waiting", st.Status)
		require.NotNil(t, st.Wait)
		require.Equal(t, "approval", st.Wait.Reason)
		require.Equal(t, 2, st.Wait.Need)
		require.Equal(t, []string{}, st.Wait.ApprovedBy)
		require.NotNil(t, st.Wait.Until)
		require.NotNil(t, st.Wait.Since)
		require.Nil(t, op.Steps[0].Wait, "only a waiting step says what it waits for")
	})
	t.Run("Approve", func(t *testing.T) {
		e := requireError(t, b.admin(http.MethodPost, path(two, "approve"), `{"actor":"ann"}`), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "reason", e.Param)
		requireError(t, b.admin(http.MethodPost, path(two, "approve"), `{"reason":"ok","force":true}`), http.StatusBadRequest, "invalid_request")

		op := decode[operation](t, b.admin(http.MethodPost, path(two, "approve"), `{"reason":"looks right","actor":"ann"}`))
		require.Equal(t, "in_progress", op.Status)
		require.Equal(t, []string{"ann"}, op.Steps[1].Wait.ApprovedBy)
		// The same actor again: done, and nothing changed.
		op = decode[operation](t, b.admin(http.MethodPost, path(two, "approve"), `{"reason":"again","actor":"ann"}`))
		require.Equal(t, "in_progress", op.Status)
		require.Equal(t, []string{"ann"}, op.Steps[1].Wait.ApprovedBy)
		require.Equal(t, []string{"ann"}, b.approvals("")[0].ApprovedBy)
		require.Len(t, op.Audit, 3)
		require.Equal(t, []string{"refused", "done", "done"}, []string{op.Audit[0].Result, op.Audit[1].Result, op.Audit[2].Result})
		require.Equal(t, "approve", op.Audit[2].Action)
		require.Equal(t, "again", op.Audit[2].Reason)

		// The actor defaults to admin: a second, distinct approval.
		decode[operation](t, b.admin(http.MethodPost, path(two, "approve"), `{"reason":"four eyes"}`))
		info := b.waitFor(two.String())
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, "admin", info.Audit[len(info.Audit)-1].Actor)
		require.Equal(t, []string{one.String()}, []string{b.approvals("")[0].OperationID})

		e = requireError(t, b.admin(http.MethodPost, path(two, "approve"), `{"reason":"late"}`), http.StatusConflict, "operation_final")
		require.Contains(t, e.Message, "ended")
		requireError(t, b.admin(http.MethodPost, path(two, "reject"), `{"reason":"late"}`), http.StatusConflict, "operation_final")
	})
	t.Run("Reject", func(t *testing.T) {
		e := requireError(t, b.admin(http.MethodPost, path(one, "reject"), ""), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "reason", e.Param)
		decode[operation](t, b.admin(http.MethodPost, path(one, "reject"), `{"reason":"not this one","actor":"dan"}`))
		info := b.waitFor(one.String())
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, engine.CodeRejected, info.Error.Code)
		require.False(t, info.Error.ServerFault(), "a business answer")
		require.Equal(t, engine.StepStatusCompensated, info.Steps[0].Status)
		requireError(t, b.admin(http.MethodPost, path(one, "approve"), `{"reason":"changed my mind"}`), http.StatusConflict, "operation_final")
		require.Empty(t, b.approvals(""))
	})
	t.Run("NotAwaitingApproval", func(t *testing.T) {
		parked := b.startPayout("client-a", "k-parked", payoutIn{Need: 1, Halt: true})
		e := requireError(t, b.admin(http.MethodPost, path(parked, "approve"), `{"reason":"early"}`), http.StatusConflict, "not_awaiting_approval")
		require.Contains(t, e.Message, "limit_unknown", "the refusal names why it needs attention")
		requireError(t, b.admin(http.MethodPost, path(parked, "reject"), `{"reason":"early"}`), http.StatusConflict, "not_awaiting_approval")
	})
	t.Run("Expired", func(t *testing.T) {
		expiring := b.startPayout("client-a", "k-expiring", payoutIn{Need: 1, Expires: 200 * time.Millisecond})
		info := b.waitFor(expiring.String())
		require.EqualValues(t, engine.CodeApprovalExpired, info.Error.Code)
		requireError(t, b.admin(http.MethodPost, path(expiring, "approve"), `{"reason":"too late"}`), http.StatusConflict, "operation_final")
	})
	t.Run("NoSuchOperation", func(t *testing.T) {
		requireError(t, b.admin(http.MethodPost, "/admin/operations/"+uuidString()+"/approve", `{"reason":"who"}`), http.StatusNotFound, "operation_not_found")
		requireError(t, b.admin(http.MethodPost, "/admin/operations/nope/reject", `{"reason":"who"}`), http.StatusNotFound, "operation_not_found")
	})
}

func TestApprovalsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.browser(http.MethodGet, "/ops/approvals", nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, "No operation waits for approval.")
	r = b.browser(http.MethodGet, "/ops", nil)
	require.Contains(t, r.body, `<a href="/ops/approvals">approvals</a>`, "the navigation links the approvals")

	id := b.startPayout("client-<a>", "k-page", payoutIn{Need: 2, Expires: time.Hour})
	other := b.startPayout("client-b", "k-other", payoutIn{Need: 1})
	page := "/ops/operations/" + id.String()

	t.Run("List", func(t *testing.T) {
		r := b.browser(http.MethodGet, "/ops/approvals", nil)
		requirePage(t, r, http.StatusOK)
		row := between(t, r.body, `<tr class="approval" id="approval-`+id.String()+`">`, `</tr>`)
		require.Contains(t, row, `<a href="`+page+`">`+id.String()+`</a>`)
		require.Contains(t, row, "client-&lt;a&gt;", "escaped")
		require.Contains(t, row, "payout v1")
		require.Contains(t, row, "0 of 2")
		require.Contains(t, row, `<form method="post" action="`+page+`/approve" class="decide">`)
		require.Contains(t, row, `<form method="post" action="`+page+`/reject" class="decide">`)
		require.Contains(t, row, `<input type="hidden" name="back" value="approvals">`)
		require.Less(t, strings.Index(r.body, id.String()), strings.Index(r.body, other.String()), "oldest first")
		require.Contains(t, between(t, r.body, `id="approval-`+other.String()+`">`, `</tr>`), "never")
	})
	t.Run("OperationPage", func(t *testing.T) {
		r := b.browser(http.MethodGet, page, nil)
		requirePage(t, r, http.StatusOK)
		box := between(t, r.body, `<div class="box wait" id="wait-approval">`, `</div>`)
		require.Contains(t, box, "waits for approval")
		require.Contains(t, box, `<dd class="wait-approvals">0 of 2</dd>`)
		require.Contains(t, box, `<dd class="wait-approved-by">nobody yet</dd>`)
		require.NotContains(t, box, "no end is fixed", "it expires")
		require.Contains(t, r.body, `<form method="post" action="`+page+`/approve">`)
		require.Contains(t, r.body, `<form method="post" action="`+page+`/reject">`)
		require.NotContains(t, r.body, `/resolve">`, "a wait for people is not resolved")
	})
	t.Run("ApproveFromTheList", func(t *testing.T) {
		r := b.browserAs("ann", http.MethodPost, page+"/approve", url.Values{"reason": {"looks right"}, "back": {"approvals"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		to := "/ops/approvals?done=approved&operation=" + id.String()
		require.Equal(t, to, r.header.Get("Location"))
		r = b.browserAs("ann", http.MethodGet, to, nil)
		requirePage(t, r, http.StatusOK)
		require.Contains(t, between(t, r.body, `<p class="flash ok" role="status">`, `</p>`), "Approved: 1 of 2 approvals (ann)")
		require.Contains(t, between(t, r.body, `id="approval-`+id.String()+`">`, `</tr>`), "1 of 2<br><small>ann</small>")

		// Again by ann: done, nothing changed.
		r = b.browserAs("ann", http.MethodPost, page+"/approve", url.Values{"reason": {"again"}, "back": {"approvals"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		r = b.browserAs("ann", http.MethodGet, r.header.Get("Location"), nil)
		require.Contains(t, r.body, "Approved: 1 of 2 approvals (ann)")
	})
	t.Run("Refusals", func(t *testing.T) {
		// No reason: the list again, saying why.
		r := b.browserAs("bob", http.MethodPost, page+"/approve", url.Values{"reason": {" "}, "back": {"approvals"}})
		requirePage(t, r, http.StatusBadRequest)
		problem := between(t, r.body, `<p class="flash error" role="alert">`, `</p>`)
		require.Contains(t, problem, `<a class="mono" href="`+page+`">`)
		require.Contains(t, problem, "invalid_request")
		require.Contains(t, problem, "needs a reason")
		require.Contains(t, r.body, `id="approval-`+id.String()+`"`, "the list is still there")
		// From the operation's page: that page, saying why.
		r = b.browserAs("bob", http.MethodPost, page+"/reject", url.Values{})
		requirePage(t, r, http.StatusBadRequest)
		require.Contains(t, r.body, `<span id="status" class="status st-in_progress">`)
		require.Contains(t, between(t, r.body, `<p class="flash error" role="alert">`, `</p>`), "a rejection needs a reason")
		// A program gets the JSON error.
		e := requireError(t, b.do(http.MethodPost, page+"/approve", "back=approvals", "Authorization", basic("bob", adminToken),
			"Content-Type", "application/x-www-form-urlencoded"), http.StatusBadRequest, "invalid_request")
		require.Equal(t, "reason", e.Param)
		r = b.browser(http.MethodPost, "/ops/operations/"+uuidString()+"/approve", url.Values{"reason": {"x"}})
		requirePage(t, r, http.StatusNotFound)
		require.Contains(t, r.body, "operation_not_found")
		// Every refusal is in the audit trail.
		op := decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+id.String(), ""))
		require.Len(t, op.Audit, 5)
		require.Equal(t, "refused", op.Audit[4].Result)
		require.Equal(t, "bob", op.Audit[4].Actor)
	})
	t.Run("ApproveFromItsPage", func(t *testing.T) {
		r := b.browserAs("bob", http.MethodPost, page+"/approve", url.Values{"reason": {"four eyes"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, page+"?done=approved", r.header.Get("Location"))
		require.Equal(t, engine.StatusSucceeded, b.waitFor(id.String()).Status)
		r = b.browserAs("bob", http.MethodGet, page+"?done=approved", nil)
		requirePage(t, r, http.StatusOK)
		require.Contains(t, r.body, "Approved: it went on and succeeded.")
		require.NotContains(t, r.body, `http-equiv="refresh"`, "nothing more to follow")
		require.NotContains(t, r.body, `id="wait-approval"`)
		require.NotContains(t, r.body, `/approve">`, "no form once it ended")
		require.Contains(t, between(t, r.body, `<table id="audit">`, `</table>`), "bob")

		// Too late: refused, on the page it came from.
		r = b.browserAs("cat", http.MethodPost, page+"/reject", url.Values{"reason": {"late"}})
		requirePage(t, r, http.StatusConflict)
		require.Contains(t, between(t, r.body, `<p class="flash error" role="alert">`, `</p>`), "operation_final")
		r = b.browserAs("cat", http.MethodPost, page+"/approve", url.Values{"reason": {"late"}, "back": {"approvals"}})
		requirePage(t, r, http.StatusConflict)
		require.Contains(t, r.body, "<h1>Approvals</h1>")
		require.Contains(t, between(t, r.body, `<p class="flash error" role="alert">`, `</p>`), "operation_final")
	})
	t.Run("RejectFromTheList", func(t *testing.T) {
		r := b.browserAs("dan", http.MethodPost, "/ops/operations/"+other.String()+"/reject", url.Values{"reason": {"not this one"}, "back": {"approvals"}})
		require.Equal(t, http.StatusSeeOther, r.status, r.body)
		require.Equal(t, "/ops/approvals?done=rejected&operation="+other.String(), r.header.Get("Location"))
		info := b.waitFor(other.String())
		require.EqualValues(t, engine.CodeRejected, info.Error.Code)
		r = b.browserAs("dan", http.MethodGet, r.header.Get("Location"), nil)
		requirePage(t, r, http.StatusOK)
		require.Contains(t, r.body, "Rejected: it failed.")
		require.Contains(t, r.body, "No operation waits for approval.")
	})
}

// TestApprovalsCrossOrigin: an approval or a rejection that a browser sends
// from another site is refused before it reaches the engine, as every
// state-changing request is.
func TestApprovalsCrossOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.startPayout("client-a", "k-csrf", payoutIn{Need: 1})
	for _, action := range []string{"approve", "reject"} {
		for _, path := range []string{"/admin/operations/" + id.String() + "/" + action, "/ops/operations/" + id.String() + "/" + action} {
			for _, header := range [][]string{
				{"Sec-Fetch-Site", "cross-site"},
				{"Sec-Fetch-Site", "same-site"},
				{"Origin", "https://attacker.example"},
			} {
				r := b.do(http.MethodPost, path, "reason=x&back=approvals", append([]string{"Authorization", basic("ops", adminToken),
					"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
				requireError(t, r, http.StatusForbidden, "cross_origin_request")
			}
		}
	}
	op := decode[operation](t, b.admin(http.MethodGet, "/admin/operations/"+id.String(), ""))
	require.Equal(t, "waiting", op.Steps[1].Status, "nothing was decided")
	require.Empty(t, op.Audit, "nothing reached the engine")
	require.Len(t, b.approvals(""), 1)
}
