package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/opscli"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestVersionsDeploy walks the deploy story of the refund's two versions: a
// version-2 refund crashed in its receipt step is left alone by a demo that
// runs version 1 only (in progress, 409 to the client, never failed or
// compensated, whatever the lease), `demo ops check` names it for that demo's
// versions and passes for 1,2, and a demo that runs both finishes it, with its
// receipt; a version-1 refund resumed by that demo runs three steps.
func TestVersionsDeploy(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	both := []string{"-refund-versions", "1,2"}

	// A version-1 refund crashed in finalize, by a demo that runs version 1.
	d := startDemo(t, dbURL, &demoOpts{crash: "finalize:before"})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	keyV1 := newKey()
	bodyV1 := map[string]any{"orderId": "A-1", "amount": 100}
	_, err := c.send(http.MethodPost, "/refunds", keyV1, bodyV1)
	require.Error(t, err)
	require.Equal(t, crashExitCode, d.waitExit())

	// A version-2 refund crashed in receipt, by a demo that runs both.
	d = startDemo(t, dbURL, &demoOpts{crash: "receipt:before", args: both})
	c = d.client(t, tokenA)
	keyV2 := newKey()
	bodyV2 := map[string]any{"orderId": "A-1", "amount": 200}
	_, err = c.send(http.MethodPost, "/refunds", keyV2, bodyV2)
	require.Error(t, err)
	require.Equal(t, crashExitCode, d.waitExit())

	// A demo of version 1 only: it finishes the version-1 refund and leaves
	// the version-2 one alone, for several leases.
	d = startDemo(t, dbURL, nil)
	c = d.client(t, tokenA)
	r := c.postUntilFinal("/refunds", keyV1, bodyV1)
	requireStatus(t, r, http.StatusCreated)
	ref := decodeAs[refundBody](t, r)
	require.Nil(t, ref.Receipt, "a version-1 refund has no receipt")
	opV1 := c.getOperation(r.header.Get("Operation-Id"))
	require.Equal(t, 1, opV1.Version)
	require.Len(t, opV1.Steps, 3)

	time.Sleep(3 * time.Second) // three leases of 1 s, many sweeps
	r = c.post("/refunds", keyV2, bodyV2)
	requireError(t, r, http.StatusConflict, "request_in_progress")
	idV2 := r.header.Get("Operation-Id")
	opV2 := c.getOperation(idV2)
	require.Equal(t, 2, opV2.Version)
	require.Equal(t, "in_progress", opV2.Status)
	require.Len(t, opV2.Steps, 4)
	for _, st := range opV2.Steps[:3] {
		require.Equal(t, "succeeded", st.Status, "step %s", st.Name)
	}
	require.Equal(t, "pending", opV2.Steps[3].Status)
	m := metricsOf(t, d)
	require.Equal(t, 1.0, m[`idemflow_operations_waiting_for_version{operation="refund",version="2"}`])
	require.Equal(t, 1.0, m[`idemflow_operations_in_progress{operation="refund"}`])
	require.Equal(t, 0, opV2.Steps[3].Attempts, "a version-1 demo ran the receipt step")
	require.Contains(t, d.stderr.String(), "this process does not run its version")
	require.Equal(t, 1, strings.Count(d.stderr.String(), idV2+" operation=refund version=2"), "logged once")
	c.requireBooks(5000, 300)

	check := demoOps(t, dbURL, "check")
	require.Equal(t, 1, check.code, "check for version 1: %s %s", check.stdout, check.stderr)
	require.Equal(t, idV2+" refund 2\n", check.stdout)
	check = demoOps(t, dbURL, "-refund-versions", "1,2", "check")
	require.Equal(t, 0, check.code, "check for 1,2: %s %s", check.stdout, check.stderr)
	require.Empty(t, check.stdout)
	// The idemflow command's show and processes, through demo ops.
	shown := demoOps(t, dbURL, "show", idV2)
	require.Equal(t, 0, shown.code, shown.stderr)
	require.Contains(t, shown.stdout, "version 2")
	require.Contains(t, shown.stdout, "receipt")
	procs := demoOps(t, dbURL, "processes")
	require.Equal(t, 0, procs.code, procs.stderr)
	require.Contains(t, procs.stdout, "refund@1")
	require.NotContains(t, procs.stdout, "refund@2")
	d.stop()

	// With no process running at all, demo ops check judges by this build's
	// definitions all the same: the check to run before a deploy. The
	// idemflow command's check, which knows no definitions, judges by the
	// live processes: with none, nothing unfinished can run.
	check = demoOps(t, dbURL, "check")
	require.Equal(t, 1, check.code, "check for version 1, no process: %s %s", check.stdout, check.stderr)
	require.Equal(t, idV2+" refund 2\n", check.stdout)
	require.Contains(t, check.stderr, "no definition of refund version 2")
	check = demoOps(t, dbURL, "-refund-versions", "1,2", "check")
	require.Equal(t, 0, check.code, "check for 1,2, no process: %s %s", check.stdout, check.stderr)
	var out, errOut bytes.Buffer
	require.Equal(t, 1, opscli.Run(t.Context(), []string{"-database-url", dbURL, "check"}, func(string) string { return "" }, &out, &errOut), errOut.String())
	require.Equal(t, idV2+" refund 2\n", out.String())

	// The deploy: a demo that runs both finishes the version-2 refund.
	d = startDemo(t, dbURL, &demoOpts{args: both})
	c = d.client(t, tokenA)
	r = c.postUntilFinal("/refunds", keyV2, bodyV2)
	requireStatus(t, r, http.StatusCreated)
	ref = decodeAs[refundBody](t, r)
	require.NotNil(t, ref.Receipt)
	require.True(t, strings.HasPrefix(*ref.Receipt, "rc_"), *ref.Receipt)
	require.Equal(t, ref.Receipt, c.getRefund(ref.RefundID).Receipt)
	opV2 = c.getOperation(idV2)
	require.Equal(t, "succeeded", opV2.Status)
	require.Equal(t, 1, opV2.Steps[0].Attempts, "the ledger ran once")
	require.Len(t, c.providerRefunds(), 2)
	c.requireBooks(5000, 300)

	// New refunds start on version 2.
	r = c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 50})
	requireStatus(t, r, http.StatusCreated)
	require.Equal(t, 2, c.getOperation(r.header.Get("Operation-Id")).Version)
	require.NotNil(t, decodeAs[refundBody](t, r).Receipt)
	require.Equal(t, 0, demoOps(t, dbURL, "-refund-versions", "2", "check").code)
	d.stop()
}

// TestOlderThanDatabase: a demo left running while a newer build applies a
// migration that is not rolling (played here as 00015 was: a column that
// every start names is renamed, and the version moved on) reports itself
// unhealthy, answers keyed requests, replays included, and reads of
// operations 503 service_unavailable with Retry-After, consuming no key, and
// logs once the migration it lacks. A demo of the old build started then
// refuses to start; the database moved back, the first serves again.
func TestOlderThanDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, nil)
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	refundKey := newKey()
	refundBody := map[string]any{"orderId": "A-1", "amount": 100}
	r := c.post("/refunds", refundKey, refundBody)
	requireStatus(t, r, http.StatusCreated)
	opID := r.header.Get("Operation-Id")
	requireStatus(t, d.client(t, "").get("/healthz"), http.StatusOK)
	// The provider's webhook for the refund is applied first: what it writes
	// is not a key consumed while the schema is unfit.
	var created struct {
		RefundID string `json:"refundId"`
	}
	require.NoError(t, json.Unmarshal(r.body, &created))
	refundID := created.RefundID
	eventually(t, func() bool { return c.getRefund(refundID).ProviderConfirmed }, "the refund is confirmed")

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	countOperations := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation`).Scan(&n))
		return n
	}
	operations := countOperations()
	files, err := fs.Glob(store.Migrations(), "*.sql")
	require.NoError(t, err)
	next := len(files) + 1
	_, err = pool.Exec(ctx, `ALTER TABLE idemflow_operation RENAME COLUMN key_seed TO key_seed_v2;
		UPDATE idemflow_schema_version SET version = version + 1`)
	require.NoError(t, err)

	h := d.client(t, "").get("/healthz")
	requireStatus(t, h, http.StatusServiceUnavailable)
	require.JSONEq(t, `{"status":"unavailable"}`, string(h.body))
	requireUnavailable := func(r *response) {
		t.Helper()
		requireError(t, r, http.StatusServiceUnavailable, "service_unavailable")
		require.NotEmpty(t, r.header.Get("Retry-After"))
	}
	requireUnavailable(c.post("/refunds", refundKey, refundBody))
	requireUnavailable(c.post("/refunds", newKey(), refundBody))
	requireUnavailable(c.post("/orders", newKey(), map[string]any{"orderId": "A-2", "customerId": "cus_1", "amount": 10}))
	requireUnavailable(c.get("/operations/" + opID))
	requireStatus(t, d.client(t, "").get("/healthz"), http.StatusServiceUnavailable)
	require.Equal(t, operations, countOperations(), "no key consumed")
	logged := fmt.Sprintf("a newer build applied idemflow migration %d, which this build lacks", next)
	require.Equal(t, 1, strings.Count(d.stderr.String(), logged), d.stderr.String())

	// Another process of the old build does not start.
	old := startDemo(t, dbURL, &demoOpts{noWait: true})
	require.Error(t, old.awaitListening())
	require.NotEqual(t, 0, old.waitExit())
	require.Contains(t, old.stderr.String(), logged)
	require.Contains(t, old.stderr.String(), engine.ErrIncompatibleSchema.Error(), "the reason it exits")

	// Moved back (the newer build's down migration): the demo serves again.
	_, err = pool.Exec(ctx, `ALTER TABLE idemflow_operation RENAME COLUMN key_seed_v2 TO key_seed;
		UPDATE idemflow_schema_version SET version = version - 1`)
	require.NoError(t, err)
	requireStatus(t, d.client(t, "").get("/healthz"), http.StatusOK)
	requireStatus(t, c.post("/refunds", refundKey, refundBody), http.StatusCreated)
	requireStatus(t, c.post("/refunds", newKey(), refundBody), http.StatusCreated)
	c.requireBooks(5000, 200)
	d.stop()
}
