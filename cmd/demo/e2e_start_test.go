package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestSIGTERM stops the demo while a refund waits for the provider: it exits 0,
// and the refund is made once, whether the drain finished it or the next start
// resumes it.
func TestSIGTERM(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-wait", "200ms"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	c.setFault("slow", 1, 1000)
	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 900}
	requireStatus(t, c.post("/refunds", key, body), http.StatusAccepted)
	d.stop()

	d = startDemo(t, dbURL, nil)
	c = d.client(t, tokenA)
	r := c.postUntilFinal("/refunds", key, body)
	requireStatus(t, r, http.StatusCreated)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	refunds := c.providerRefunds()
	require.Len(t, refunds, 1)
	require.Equal(t, 1, refunds[0].Requests)
	c.requireBooks(5000, 900)
	d.stopWith(syscall.SIGINT)
}

// TestConcurrentStart starts two demos at once on an empty database: both apply
// or wait for the migrations (the engine's, River's, the ledger's, the
// provider's), come up, and serve the same data.
func TestConcurrentStart(t *testing.T) {
	t.Parallel()
	dbURL := emptyDatabaseURL(t)
	demos := []*demo{startDemo(t, dbURL, &demoOpts{noWait: true}), startDemo(t, dbURL, &demoOpts{noWait: true})}
	errs := make([]error, len(demos))
	var wg sync.WaitGroup
	for i, d := range demos {
		wg.Go(func() { errs[i] = d.awaitListening() })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, d := range demos {
		r := d.client(t, "").get("/healthz")
		requireStatus(t, r, http.StatusOK)
	}
	a := demos[0].client(t, tokenA)
	a.createOrder("A-1", "cus_1", 100)
	require.Equal(t, int64(100), demos[1].client(t, tokenA).getOrder("A-1").Amount)
	r := demos[1].client(t, tokenA).post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 40})
	requireStatus(t, r, http.StatusCreated)
	a.requireBooks(100, 40)
	for _, d := range demos {
		d.stop()
	}
}

// TestEnvironment configures the demo through its environment variables alone.
func TestEnvironment(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{bare: true, env: []string{
		"DEMO_ADDR=127.0.0.1:0",
		"DEMO_CLIENTS=shop=tok-shop,other=tok-other",
		"DEMO_RETRY_BACKOFF=50ms",
		"DEMO_WAIT=300ms",
		"DEMO_LEASE=1s",
	}})
	require.Contains(t, d.stdout.String(), "shop")
	require.Contains(t, d.stdout.String(), "tok-shop")
	requireError(t, d.client(t, tokenA).get("/accounts"), http.StatusUnauthorized, "unauthenticated")
	c := d.client(t, "tok-shop")
	c.createOrder("A-1", "cus_1", 500)
	require.Empty(t, d.client(t, "tok-other").accounts())

	// DEMO_WAIT: a provider slower than it gets a 202.
	c.setFault("slow", 1, 1000)
	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 100}
	requireStatus(t, c.post("/refunds", key, body), http.StatusAccepted)
	requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)
	c.requireBooks(500, 100)
	d.stop()
}

// TestProviderURL runs the fake provider alone ("demo provider") and points the
// demo at it with -provider-url.
func TestProviderURL(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	p := startDemo(t, dbURL, &demoOpts{provider: true})
	d := startDemo(t, dbURL, &demoOpts{args: []string{"-provider-url", p.base}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 500)
	r := c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100})
	requireStatus(t, r, http.StatusCreated)
	ref := decodeAs[refundBody](t, r)

	// The provider alone serves its API at its root and under /provider.
	pc := p.client(t, "")
	for _, path := range []string{"/refunds", "/provider/refunds"} {
		r := pc.get(path)
		requireStatus(t, r, http.StatusOK)
		body := decodeAs[struct {
			Refunds []providerRefund `json:"refunds"`
			Next    *string          `json:"next"`
		}](t, r)
		require.Len(t, body.Refunds, 1)
		require.Equal(t, *ref.ProviderRefundID, body.Refunds[0].ID)
	}
	c.requireBooks(500, 100)
	d.stop()
	p.stop()
}

// TestPrivateCluster starts the demo without DATABASE_URL: it runs a PostgreSQL
// cluster of its own in -data-dir (as an unprivileged user when the tests run as
// root), which survives a killed demo and is reused by the next, and which a
// demo that started it stops when it exits.
func TestPrivateCluster(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.BinDir(); err != nil {
		pgcluster.SkipMissing(t, "no PostgreSQL server binaries: %v", err)
	}
	dataDir := filepath.Join(t.TempDir(), "demo-pg")
	t.Cleanup(func() {
		// Whatever happened, no server outlives the test (nor its directory).
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := pgcluster.Stop(ctx, &pgcluster.Config{DataDir: dataDir})
		require.NoError(t, err)
	})
	opts := &demoOpts{args: []string{"-data-dir", dataDir}}
	pidFile := filepath.Join(dataDir, "postmaster.pid")

	d := startDemo(t, "", opts)
	require.Contains(t, d.stderr.String(), "started_here=true")
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 500)
	d.kill()
	require.FileExists(t, pidFile, "a killed demo leaves its cluster running")

	d = startDemo(t, "", opts)
	require.Contains(t, d.stderr.String(), "started_here=false", "the running cluster is reused")
	c = d.client(t, tokenA)
	require.Equal(t, int64(500), c.getOrder("A-1").Amount)
	d.stop()

	// The reusing demo left the cluster running: `demo db stop` stops it, so
	// that the next demo starts it.
	require.FileExists(t, pidFile)
	bin, err := demoBinary()
	require.NoError(t, err)
	out, err := exec.CommandContext(t.Context(), bin, "db", "stop", "-data-dir", dataDir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "stopped the PostgreSQL cluster in "+dataDir)
	_, err = os.Stat(pidFile)
	require.ErrorIs(t, err, os.ErrNotExist)
	out, err = exec.CommandContext(t.Context(), bin, "db", "stop", "-data-dir", dataDir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "no PostgreSQL cluster runs in "+dataDir)
	d = startDemo(t, "", opts)
	require.Contains(t, d.stderr.String(), "started_here=true")
	c = d.client(t, tokenA)
	requireStatus(t, c.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100}), http.StatusCreated)
	c.requireBooks(500, 100)
	d.stop()
	_, err = os.Stat(pidFile)
	require.ErrorIs(t, err, os.ErrNotExist, "the demo stopped the cluster it started")
}
