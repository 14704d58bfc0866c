package opsweb_test

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/reconcile"
)

// requirePage requires an HTML page of status with the pages' headers: no
// script allowed, nor anything else but the inline style, whose hash the
// policy names.
func requirePage(t *testing.T, r *response, status int) {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.body)
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	require.Equal(t, "DENY", r.header.Get("X-Frame-Options"))
	require.Equal(t, "no-store", r.header.Get("Cache-Control"))
	csp := r.header.Get("Content-Security-Policy")
	require.Contains(t, csp, "default-src 'none'")
	require.Contains(t, csp, "frame-ancestors 'none'")
	require.Contains(t, csp, "form-action 'self'")
	require.NotContains(t, csp, "script-src")
	require.NotContains(t, strings.ToLower(r.body), "<script")
	m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindAllStringSubmatch(r.body, -1)
	require.Len(t, m, 1, "one inline style")
	sum := sha256.Sum256([]byte(m[0][1]))
	require.Contains(t, csp, "style-src 'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'", "the policy allows the style as served")
}

func TestListPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := b.start("client-a", "k-<b>ok</b>", modeOK)
	failed := b.start("client-b", "k-fail", modeFail)
	parked := b.start("client-a", "k-halt", modeHaltBefore)

	r := b.browser(http.MethodGet, "/ops", nil)
	requirePage(t, r, http.StatusOK)
	for _, info := range []*engine.Info{ok, failed, parked} {
		require.Contains(t, r.body, `<a href="/ops/operations/`+info.ID.String()+`">`+info.ID.String()+`</a>`)
	}
	require.Less(t, strings.Index(r.body, parked.ID.String()), strings.Index(r.body, ok.ID.String()), "newest first")
	require.Contains(t, r.body, "k-&lt;b&gt;ok&lt;/b&gt;", "keys are escaped")
	require.NotContains(t, r.body, "<b>ok</b>")
	require.Contains(t, r.body, "limit_unknown", "why it needs attention")
	require.Contains(t, r.body, `<form class="filters" method="get" action="/ops">`)
	require.Regexp(t, `<td class="num"><a class="attention" href="/ops\?needsAttention=true&amp;name=payment">1</a></td>`, r.body, "the summary of what is in progress")

	r = b.browser(http.MethodGet, "/ops?status=failed&name=&client=&olderThan=&limit=", nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, failed.ID.String())
	require.NotContains(t, r.body, ok.ID.String())
	require.Contains(t, r.body, `<option value="failed" selected>`)

	r = b.browser(http.MethodGet, "/ops?limit=2", nil)
	requirePage(t, r, http.StatusOK)
	require.NotContains(t, r.body, ok.ID.String())
	next := regexp.MustCompile(`<a href="([^"]+)" rel="next">`).FindStringSubmatch(r.body)
	require.NotNil(t, next, "a link to the next page")
	r = b.browser(http.MethodGet, strings.ReplaceAll(next[1], "&amp;", "&"), nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, ok.ID.String())
	require.NotContains(t, r.body, parked.ID.String())

	r = b.browser(http.MethodGet, "/ops?olderThan=soon", nil)
	requirePage(t, r, http.StatusBadRequest)
	require.Contains(t, r.body, "olderThan is a positive duration")

	r = b.browser(http.MethodGet, "/ops/nothing", nil)
	requirePage(t, r, http.StatusNotFound)
	require.Contains(t, r.body, "not_found")
	requireError(t, b.admin(http.MethodGet, "/ops/nothing", ""), http.StatusNotFound, "not_found")
}

func TestOperationPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	failed := b.start("client-b", "k-fail", modeFail)
	page := "/ops/operations/" + failed.ID.String()

	r := b.browser(http.MethodGet, page, nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, `<span id="status" class="status st-failed">failed</span>`)
	rows := regexp.MustCompile(`<tr class="step st-[a-z_]+" id="step-([a-z]+)">`).FindAllStringSubmatch(r.body, -1)
	require.Len(t, rows, 3, "every step")
	require.Equal(t, []string{"reserve", "charge", "record"}, []string{rows[0][1], rows[1][1], rows[2][1]})
	require.Contains(t, r.body, `<td class="mono derived-key">`+failed.Steps[1].DerivedKey+`</td>`)
	require.Contains(t, r.body, "dial tcp 10.0.0.7:443", "the operators' cause")
	require.Contains(t, r.body, engine.CodeAttemptsExhausted)
	require.Contains(t, r.body, `<form method="post" action="`+page+`/retry">`)
	require.Contains(t, r.body, `<input type="hidden" name="force" value="1">`, "a server fault: a forced retry")
	require.NotContains(t, r.body, `/cancel">`, "a failed operation cannot be cancelled")
	require.NotContains(t, r.body, `http-equiv="refresh"`)

	// The retry button: 303 to the page, which follows the run.
	b.healed.Store("k-fail", true)
	r = b.browser(http.MethodPost, page+"/retry", url.Values{})
	requirePage(t, r, http.StatusConflict)
	require.Contains(t, r.body, "operation_final", "unforced")
	r = b.browser(http.MethodPost, page+"/retry", url.Values{"force": {"1"}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, page+"?done=retried", r.header.Get("Location"))
	r = b.browser(http.MethodGet, page+"?done=retried", nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, "Reopened")
	require.Equal(t, engine.StatusSucceeded, b.waitFor(failed.ID.String()).Status)
	r = b.browser(http.MethodGet, page+"?done=retried", nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, `<span id="status" class="status st-succeeded">succeeded</span>`)
	require.Contains(t, r.body, "Reopened: the new run succeeded.")
	require.NotContains(t, r.body, `http-equiv="refresh"`, "a finished operation is not reloaded")
	require.NotContains(t, r.body, `<button`, "nothing to do")

	// A refused retry: the page again, saying why.
	r = b.browser(http.MethodPost, page+"/retry", url.Values{})
	requirePage(t, r, http.StatusConflict)
	require.Contains(t, r.body, "operation_not_failed")
	// The same refusal for a program: JSON.
	requireError(t, b.do(http.MethodPost, page+"/retry", "", "Authorization", basic("x", adminToken)), http.StatusConflict, "operation_not_failed")

	r = b.browser(http.MethodGet, "/ops/operations/"+uuidString(), nil)
	requirePage(t, r, http.StatusNotFound)
	require.Contains(t, r.body, "operation_not_found")
	requireError(t, b.admin(http.MethodGet, "/ops/operations/nope", ""), http.StatusNotFound, "operation_not_found")
}

func TestCancelPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := b.start("client-a", "k-after", modeHaltAfter)
	page := "/ops/operations/" + past.ID.String()

	r := b.browser(http.MethodGet, page, nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, "Needs attention: ledger_mismatch")
	require.Contains(t, r.body, "Parked")
	require.Contains(t, r.body, `<button type="submit" id="retry">`)
	require.Contains(t, r.body, `<button type="submit" id="cancel">`)

	r = b.browser(http.MethodPost, page+"/cancel", url.Values{"reason": {"try"}})
	requirePage(t, r, http.StatusConflict)
	require.Contains(t, r.body, "past_point_of_no_return")
	require.Contains(t, r.body, `<span id="status" class="status st-in_progress">in_progress</span>`)

	before := b.start("client-a", "k-before", modeHaltBefore)
	page = "/ops/operations/" + before.ID.String()
	r = b.browser(http.MethodPost, page+"/cancel", url.Values{"reason": {"  customer withdrew "}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	r = b.browser(http.MethodGet, r.header.Get("Location"), nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, "Cancelled")
	require.Contains(t, r.body, "customer withdrew")
	require.Contains(t, r.body, `<span id="status" class="status st-failed">failed</span>`)

	r = b.browser(http.MethodPost, page+"/cancel", url.Values{"reason": {strings.Repeat("x", 1001)}})
	requirePage(t, r, http.StatusBadRequest)
}

// TestRunbookLinks: the operation page links its attention code, and the
// pages every mismatch kind, to the runbook's section on it: the
// repository's runbook by default, Config.RunbookURL's when given.
func TestRunbookLinks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	parked := b.start("client-a", "k-before", modeHaltBefore)
	ok := b.start("client-a", "k-ok", modeOK)
	b.failRecord(ok, "re_ok")
	b.provider.add(reconcile.Record{Key: "outside-1", Reference: "re_outside", Amount: 300})
	_, err := b.e.Reconcile(t.Context(), "provider")
	require.NoError(t, err)
	const base = opsweb.DefaultRunbookURL
	require.Equal(t, "https://github.com/idemflow/idemflow/blob/main/docs/runbook.md", base)

	r := b.browser(http.MethodGet, "/ops/operations/"+parked.ID.String(), nil)
	requirePage(t, r, http.StatusOK)
	box := between(t, r.body, `<div class="box attention" id="attention">`, `</div>`)
	require.Contains(t, box, `<a class="runbook" id="runbook-attention" href="`+base+`#limit_unknown" rel="noreferrer">the runbook on limit_unknown</a>`)

	r = b.browser(http.MethodGet, "/ops/operations/"+ok.ID.String(), nil)
	requirePage(t, r, http.StatusOK)
	require.Contains(t, r.body, `href="`+base+`#`+engine.CodeReconciliationMismatch+`"`)
	table := between(t, r.body, `<table id="mismatches">`, `</table>`)
	require.Contains(t, table, `<td class="attention"><a class="runbook" href="`+base+`#record_failed" rel="noreferrer" title="the runbook on record_failed">record_failed</a></td>`)

	r = b.browser(http.MethodGet, "/ops/reconciliation", nil)
	requirePage(t, r, http.StatusOK)
	for _, kind := range []reconcile.Kind{reconcile.UnknownKey, reconcile.RecordFailed} {
		require.Contains(t, r.body, `<a class="runbook" href="`+base+`#`+string(kind)+`"`)
	}

	// A runbook of the service's own, here on its server.
	h, err := opsweb.New(b.e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken), RunbookURL: "/docs/runbook.html"})
	require.NoError(t, err)
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/ops/operations/"+parked.ID.String(), nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Accept", "text/html")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.EqualValues(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `href="/docs/runbook.html#limit_unknown"`)
}

// TestRunbookSections: the repository's runbook, DefaultRunbookURL, has the
// section that a link names for every attention code of the engine's, every
// mismatch kind, and the demo refund's halt: a heading that is the code.
func TestRunbookSections(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "docs", "runbook.md"))
	require.NoError(t, err)
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^#{2,4} `([a-z_]+)`$").FindAllStringSubmatch(string(raw), -1) {
		headings[m[1]] = true
	}
	codes := []string{
		string(engine.CodeRetryingPastPivot), string(engine.CodeFailedPastPivot), string(engine.CodeOutcomeUnknown), string(engine.CodeOutcomeOverdue),
		string(engine.CodeDatabaseUnavailable), string(engine.CodeUndecodableState), string(engine.CodeDefinitionChanged), string(engine.CodeVersionNotRun),
		string(engine.CodeReconciliationMismatch), string(engine.CodeCompensationFailed),
		"provider_mismatch", // workflows/refund's CodeProviderMismatch
	}
	for _, k := range reconcile.Kinds {
		codes = append(codes, string(k))
	}
	for _, code := range codes {
		require.True(t, headings[code], "docs/runbook.md has no heading `%s`", code)
	}
}
