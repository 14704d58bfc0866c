package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// metricsOf reads GET /metrics (no authentication) into series → value.
func metricsOf(t *testing.T, d *demo) map[string]float64 {
	t.Helper()
	m, err := scrapeMetrics(d.base)
	require.NoError(t, err)
	return m
}

// scrapeMetrics reads the metrics that the demo at base serves, by series.
func scrapeMetrics(base string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// TestMetrics: the metrics' values after known traffic: a refund, its replay,
// a reused key, a refund whose provider call failed once, and, in a second
// demo, the resume of a refund whose demo crashed.
func TestMetrics(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	d := startDemo(t, dbURL, nil)
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)

	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 100}
	requireStatus(t, c.post("/refunds", key, body), http.StatusCreated)
	requireStatus(t, c.post("/refunds", key, body), http.StatusCreated)
	requireError(t, c.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 101}), http.StatusUnprocessableEntity, "idempotency_key_reused")
	c.setFault("error", 1, 0)
	requireStatus(t, c.postUntilFinal("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 200}), http.StatusCreated)

	m := metricsOf(t, d)
	for series, want := range map[string]float64{
		`idemflow_operations_started_total{operation="refund"}`:                                2,
		`idemflow_operations_started_total{operation="order"}`:                                 1,
		`idemflow_operations_finished_total{operation="refund",status="succeeded"}`:            2,
		`idemflow_step_attempts_total{operation="refund",outcome="succeeded",step="ledger"}`:   2,
		`idemflow_step_attempts_total{operation="refund",outcome="retried",step="provider"}`:   1,
		`idemflow_step_attempts_total{operation="refund",outcome="succeeded",step="provider"}`: 2,
		`idemflow_lookups_total{found="false",operation="refund",step="provider"}`:             1,
		`idemflow_idempotency_requests_total{operation="refund",outcome="created"}`:            2,
		`idemflow_idempotency_requests_total{operation="refund",outcome="replayed"}`:           1,
		`idemflow_idempotency_requests_total{operation="refund",outcome="mismatch"}`:           1,
		`idemflow_step_duration_seconds_count{operation="refund",step="finalize"}`:             2,
	} {
		require.Equal(t, want, m[series], series)
	}
	d.stop()

	d = startDemo(t, dbURL, &demoOpts{crash: "finalize:before"})
	c = d.client(t, tokenA)
	crashKey := newKey()
	crashBody := map[string]any{"orderId": "A-1", "amount": 300}
	_, err := c.send(http.MethodPost, "/refunds", crashKey, crashBody)
	require.Error(t, err)
	require.Equal(t, crashExitCode, d.waitExit())

	d = startDemo(t, dbURL, nil)
	c = d.client(t, tokenA)
	requireStatus(t, c.postUntilFinal("/refunds", crashKey, crashBody), http.StatusCreated)
	m = metricsOf(t, d)
	require.Equal(t, 1.0, m[`idemflow_recoveries_total{how="resumed",operation="refund"}`])
	require.Equal(t, 1.0, m[`idemflow_operations_finished_total{operation="refund",status="succeeded"}`])
	require.Equal(t, 0.0, m[`idemflow_operations_started_total{operation="refund"}`], "the resume reserved no key")
	require.Contains(t, m, `idemflow_operations_in_progress{operation="refund"}`)
	require.Contains(t, m, `idemflow_oldest_in_progress_seconds{operation="refund"}`)
	d.stop()
}

// TestMetricsPending: a refund that the provider accepts as pending counts its
// provider attempt as outcome "pending", never "retried" (the provider did not
// fail), and while it waits for the provider's word it is counted by
// idemflow_operations_waiting{reason="outcome"}, back to 0 once it ended.
func TestMetricsPending(t *testing.T) {
	t.Parallel()
	// The lookup is asked only after 10 s: the webhook settles it first, 3 s
	// after the call. -lease 1s reads the gauges every second.
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-retry-backoff", "10s", "-wait", "200ms", "-lease", "1s"}})
	c := d.client(t, tokenA)
	c.createOrder("A-1", "cus_1", 5000)
	c.setPending(1, 3000, "succeeded")

	const (
		pending = `idemflow_step_attempts_total{operation="refund",outcome="pending",step="provider"}`
		retried = `idemflow_step_attempts_total{operation="refund",outcome="retried",step="provider"}`
		waiting = `idemflow_operations_waiting{operation="refund",reason="outcome"}`
	)
	require.Contains(t, metricsOf(t, d), waiting, "declared at start")
	key := newKey()
	body := map[string]any{"orderId": "A-1", "amount": 700}
	id := requireAccepted(t, c.post("/refunds", key, body))
	c.awaitOperation(id, pollInterval, "the provider step waiting", func(op operation) bool {
		return stepOf(t, op, "provider").Status == "waiting"
	})
	m := metricsOf(t, d)
	require.Equal(t, 1.0, m[pending])
	require.NotContains(t, m, retried, "pending is not a failed attempt")
	require.Eventually(t, func() bool { return metricsOf(t, d)[waiting] == 1 }, finalTimeout, pollInterval, "the waiting refund is counted")

	requireStatus(t, c.postUntilFinal("/refunds", key, body), http.StatusCreated)
	m = metricsOf(t, d)
	require.Equal(t, 1.0, m[pending])
	require.NotContains(t, m, retried)
	require.Eventually(t, func() bool { return metricsOf(t, d)[waiting] == 0 }, finalTimeout, pollInterval, "nothing waits once it ended")
	d.stop()
}
