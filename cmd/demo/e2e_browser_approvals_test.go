package main

// The approvals page in a real browser: two refunds of version 3 above
// -approval-threshold wait for approval; headless Chromium, signed in as an
// operator with HTTP Basic authentication, finds them on /ops/approvals,
// approves the first from the list (it goes on: 201 to its client's retry)
// and rejects the second from its own page (422 refund_rejected). See
// docs/demo-api.md, "Approvals" and "Operators".

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

func TestApprovalsBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-refund-versions", "1,2,3",
		"-approval-threshold", "1000", "-approvals", "1", "-approval-timeout", "1h", "-wait", "200ms"}})
	c := d.client(t, tokenA)
	c.createOrder("A-37", "cus_37", 5000)

	// Two refunds at or above the threshold: each waits for approval, with
	// its amount reserved.
	approveKey, rejectKey := newKey(), newKey()
	approveBody := map[string]any{"orderId": "A-37", "amount": 1500}
	rejectBody := map[string]any{"orderId": "A-37", "amount": 1000}
	approveID := requireAccepted(t, c.post("/refunds", approveKey, approveBody))
	rejectID := requireAccepted(t, c.post("/refunds", rejectKey, rejectBody))
	for _, id := range []string{approveID, rejectID} {
		op := c.awaitOperation(id, pollInterval, "waiting for approval", waitsForApproval)
		require.Equal(t, "in_progress", op.Status, "it waits for approval")
		require.Equal(t, 3, op.Version)
		require.False(t, op.NeedsAttention, "it waits for people, not for a repair")
	}

	ctx := newBrowser(t, chromium)
	shots := t.ArtifactDir()
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	// Basic authentication: the user name is the actor of the approval.
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": basicAuth("olga", adminToken)},
	})
	require.NoError(t, err)

	// The list, from the pages' navigation: both refunds, the oldest first.
	row := "#approval-" + approveID
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops"),
		chromedp.Click(chromedp.CSS(`header nav a[href="/ops/approvals"]`)), chromedp.WaitVisible(chromedp.CSS(row))))
	rows, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.approval")))
	require.NoError(t, err)
	require.Len(t, rows, 2, "both refunds wait for approval")
	require.Equal(t, "approval-"+approveID, rows[0].AttributeValue("id"), "the oldest first")
	require.Contains(t, text(ctx, t, row), "merchant-a", "its client")
	require.Contains(t, text(ctx, t, row), "0 of 1", "no approval yet, of one needed")
	require.NotEmpty(t, text(ctx, t, row+` a[href="/ops/operations/`+approveID+`"]`), "a link to its page")
	screenshot(ctx, t, filepath.Join(shots, "1-approvals.png"))

	// Approve it from the list, with a reason: back to the list, which says
	// that it goes on and no longer lists it.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(row+` form[action$="/approve"] input[name="reason"]`), "the customer called"),
		chromedp.Click(chromedp.CSS(row+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("p.flash.ok"))))
	require.Contains(t, text(ctx, t, "p.flash.ok"), "Approved")
	require.Contains(t, text(ctx, t, "p.flash.ok"), approveID)
	rows, err = chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.approval")))
	require.NoError(t, err)
	require.Len(t, rows, 1, "only the other one waits")
	screenshot(ctx, t, filepath.Join(shots, "2-approved.png"))

	// The client's retry of its key: the refund went on, 201.
	r := c.postUntilFinal("/refunds", approveKey, approveBody)
	requireStatus(t, r, http.StatusCreated)
	refund := decodeAs[refundBody](t, r)
	require.Equal(t, "succeeded", refund.Status)
	require.NotNil(t, refund.ProviderRefundID, "the provider was asked once approved")
	require.Equal(t, "succeeded", c.getRefund(refund.RefundID).Status)
	require.Equal(t, "succeeded", stepOf(t, c.getOperation(approveID), "approval").Status)

	// The other from its page: what it waits for, and the forms.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/operations/"+rejectID), chromedp.WaitVisible(chromedp.CSS("#reject"))))
	require.Equal(t, "waiting", text(ctx, t, "#step-approval td:nth-child(4)"))
	require.Equal(t, "approval", text(ctx, t, "#wait-approval .wait-reason"))
	require.Equal(t, "0 of 1", text(ctx, t, "#wait-approval .wait-approvals"))
	screenshot(ctx, t, filepath.Join(shots, "3-operation-waiting.png"))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS("#reject-reason"), "not this one"),
		chromedp.Click(chromedp.CSS("#reject")),
		chromedp.WaitVisible(chromedp.CSS("p.flash.ok"))))
	require.Contains(t, text(ctx, t, "p.flash.ok"), "Rejected")
	require.Contains(t, text(ctx, t, "#audit"), "olga")
	require.Contains(t, text(ctx, t, "#audit"), "not this one")
	screenshot(ctx, t, filepath.Join(shots, "4-operation-rejected.png"))

	r = c.postUntilFinal("/refunds", rejectKey, rejectBody)
	requireError(t, r, http.StatusUnprocessableEntity, "refund_rejected")

	// Nothing waits any more.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/approvals"), chromedp.WaitVisible(chromedp.CSS("table.approvals"))))
	require.Contains(t, text(ctx, t, "table.approvals"), "No operation waits for approval.")
}
