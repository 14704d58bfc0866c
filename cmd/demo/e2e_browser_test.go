package main

// The operators' pages in a real browser: headless Chromium, driven over its
// DevTools protocol, finds a failed refund on /ops, opens it, sees its three
// steps and the provider step's derived key, presses Retry, and watches the
// page follow the run until the refund succeeds; River UI shows the job that
// ran it. Screenshots go to the test's artifact directory (kept with go test
// -artifacts -outputdir DIR).

import (
	"context"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// browserTimeout bounds the browser's part of the test.
const browserTimeout = 30 * time.Second

// chromiumPath returns the Chromium to drive. Without one the test is skipped,
// except in CI, which installs it (.ci/run).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	pgcluster.SkipMissing(t, "no chromium on PATH (apt-get install chromium)")
	return ""
}

// newBrowser starts headless Chromium with a profile of its own and returns
// a tab's context, bounded by browserTimeout; the browser is stopped at
// cleanup. The flags keep it off the network: without them, on a machine
// without one, it waits for its background services.
func newBrowser(t *testing.T, chromium string) context.Context {
	t.Helper()
	profile := t.TempDir() // removed after the browser is stopped: cleanups run last first
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.WithoutCancel(t.Context()),
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1400, 1000),
	)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	ctx, cancelTimeout := context.WithTimeout(ctx, browserTimeout)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
	})
	return ctx
}

// screenshot saves a PNG of the whole page to path.
func screenshot(ctx context.Context, t *testing.T, path string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot")
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s", path)
}

// text returns the text of the first element that the CSS selector matches,
// once there is one.
func text(ctx context.Context, t *testing.T, selector string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(selector)))
	require.NoError(t, err, "text of %s", selector)
	return strings.TrimSpace(s)
}

func TestOperatorsBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	start := time.Now()

	// A refund that fails: the provider answers 503 to each of its three
	// attempts, and asked by key it has no refund.
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-max-attempts", "3", "-provider-timeout", "500ms", "-provider-settle", "500ms"}})
	c := d.client(t, tokenB)
	c.createOrder("B-7", "cus_7", 3000)
	c.setFault("error", 3, 0)
	key := newKey()
	body := map[string]any{"orderId": "B-7", "amount": 1200}
	r := c.postUntilFinal("/refunds", key, body)
	requireError(t, r, http.StatusInternalServerError, "operation_failed")
	id := r.header.Get("Operation-Id")
	derivedKey := stepOf(t, c.getOperation(id), "provider").DerivedKey
	require.True(t, strings.HasPrefix(derivedKey, "idf3_"), derivedKey)

	ctx := newBrowser(t, chromium)
	shots := t.ArtifactDir()
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	// Basic authentication, any user name, the admin token as password.
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": basicAuth("operator", adminToken)},
	})
	require.NoError(t, err)

	// The list: the failed refund, among the operations of every client.
	link := `a[href="/ops/operations/` + id + `"]`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops"), chromedp.WaitVisible(chromedp.CSS(link))))
	require.Equal(t, "failed", text(ctx, t, `tr:has(`+link+`) span.status`), "the list shows it failed")
	screenshot(ctx, t, filepath.Join(shots, "1-ops-list.png"))

	// Its page: three steps, the provider step's derived key, a retry button.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(link)), chromedp.WaitVisible(chromedp.CSS("#status"))))
	require.Equal(t, "failed", text(ctx, t, "#status"))
	steps, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.step")))
	require.NoError(t, err)
	require.Len(t, steps, 3, "its three steps")
	require.Equal(t, derivedKey, text(ctx, t, "#step-provider .derived-key"), "the provider step's derived key")
	screenshot(ctx, t, filepath.Join(shots, "2-operation-failed.png"))

	// The retry button, a forced retry of the 500 its client was told; the
	// page it leads to reloads itself until the run ends.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS("#status.st-succeeded"))))
	require.Equal(t, "succeeded", text(ctx, t, "#status"))
	done, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll("tr.step.st-succeeded")))
	require.NoError(t, err)
	require.Len(t, done, 3, "every step succeeded")
	require.Equal(t, derivedKey, text(ctx, t, "#step-provider .derived-key"), "the same derived key on the retry")
	require.Equal(t, "call", text(ctx, t, "#step-provider td:nth-child(7)"))
	require.Contains(t, text(ctx, t, "p.flash.ok"), "Reopened")
	screenshot(ctx, t, filepath.Join(shots, "3-operation-retried.png"))

	// River UI, behind the same token, shows the job that ran the retry.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/riverui/jobs?state=completed"),
		chromedp.WaitVisible(`//*[contains(text(), "idemflow_resume")]`)))
	require.Contains(t, text(ctx, t, "body"), id, "the resume job names the operation")
	screenshot(ctx, t, filepath.Join(shots, "4-riverui-completed-jobs.png"))

	// The client sees the new run's answer, and the provider refunded once.
	r = c.postUntilFinal("/refunds", key, body)
	requireStatus(t, r, http.StatusCreated)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	n := 0
	for _, pr := range c.providerRefunds() {
		if pr.IdempotencyKey == derivedKey {
			n++
		}
	}
	require.Equal(t, 1, n, "one provider refund under the derived key")
	t.Logf("browser test took %s; screenshots in %s", time.Since(start).Round(time.Millisecond), shots)
}

// TestResolveBrowser: a refund whose provider step waits past -provider-settle
// while the provider cannot be asked is resolved from its page: the operator
// types the provider's refund id and a reason and clicks Resolve; the refund
// goes on to 201 with that id, and the page's audit trail names the operator.
func TestResolveBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-max-attempts", "1", "-retry-backoff", "30s", "-wait", "200ms",
		"-provider-timeout", "500ms", "-provider-settle", "500ms", "-provider-url", "http://" + closedPort(t) + "/provider"}})
	c := d.client(t, tokenA)
	c.createOrder("A-9", "cus_9", 3000)
	key := newKey()
	body := map[string]any{"orderId": "A-9", "amount": 900}
	id := requireAccepted(t, c.post("/refunds", key, body))
	c.awaitOperation(id, pollInterval, "needing attention", needsAttention)

	ctx := newBrowser(t, chromium)
	shots := t.ArtifactDir()
	_, err := chromedp.Call(ctx, network.Enable, network.EnableParams{})
	require.NoError(t, err)
	_, err = chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": basicAuth("frank", adminToken)},
	})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(d.base+"/ops/operations/"+id), chromedp.WaitVisible(chromedp.CSS("#resolve"))))
	require.Equal(t, "waiting", text(ctx, t, "#step-provider td:nth-child(4)"))
	screenshot(ctx, t, filepath.Join(shots, "1-operation-waiting.png"))

	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS("#resolve-outcome"), "made"),
		chromedp.SendKeys(chromedp.CSS("#resolve-reference"), "pr_FROMTHEBROWSER"),
		chromedp.SendKeys(chromedp.CSS("#resolve-reason"), "the provider's dashboard lists it"),
		chromedp.Click(chromedp.CSS("#resolve")),
		chromedp.WaitVisible(chromedp.CSS("p.flash.ok"))))
	require.Contains(t, text(ctx, t, "p.flash.ok"), "Resolved")
	require.Contains(t, text(ctx, t, "#audit"), "frank")
	require.Contains(t, text(ctx, t, "#audit"), "the provider's dashboard lists it")
	screenshot(ctx, t, filepath.Join(shots, "2-operation-resolved.png"))

	r := c.postUntilFinal("/refunds", key, body)
	requireStatus(t, r, http.StatusCreated)
	require.Equal(t, "pr_FROMTHEBROWSER", *decodeAs[refundBody](t, r).ProviderRefundID)
	require.Equal(t, "operator", stepOf(t, c.getOperation(id), "provider").ResolvedBy)
}
