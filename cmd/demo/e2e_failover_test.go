package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

// TestFailover: the demo on a primary with a synchronous standby, connected
// by a multi-host DATABASE_URL, with its default lease. Under refunds, the
// primary is killed (SIGKILL) and the standby promoted: requests meanwhile
// answer 503 (or 202) and are retried with their keys; the demo serves again
// by itself, without a restart; every refund is made exactly once, and the
// books and the provider agree (a reconciliation finds nothing). No refund in
// flight at the kill waits out its lease: each gets its 201 within 5 s of the
// promotion.
func TestFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := pgcluster.Replicated(t, true)

	defaults, err := parseConfig("demo", nil, func(string) string { return "" }, io.Discard)
	require.NoError(t, err)
	d := startDemo(t, pgcluster.MultiHostURL(primary, standby, "postgres"), &demoOpts{args: []string{
		"-reconcile-interval", "0", "-lease", defaults.lease.String()}})
	c := d.client(t, tokenA)
	const refunds = 20
	c.createOrder("F-1", "cus_1", 100*refunds)

	var wg sync.WaitGroup
	statuses := make([]int, refunds)
	var mu sync.Mutex
	unavailable := 0
	half := make(chan struct{})
	var done sync.Once
	finished := 0
	// killed is when the primary was killed; firstAfter, the first success of
	// a request sent after that, which only the new primary can give.
	var killed, firstAfter time.Time
	// first is when each key was first sent; created, when it was answered
	// 201.
	first, created := make([]time.Time, refunds), make([]time.Time, refunds)
	for i := range refunds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("failover-refund-%d", i)
			body := map[string]any{"orderId": "F-1", "amount": 100}
			first[i] = time.Now()
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				sent := time.Now()
				r, err := c.send(http.MethodPost, "/refunds", key, body)
				if err == nil && r.status == http.StatusCreated {
					created[i] = time.Now()
					mu.Lock()
					if !killed.IsZero() && sent.After(killed) && firstAfter.IsZero() {
						firstAfter = time.Now()
					}
					mu.Unlock()
				}
				switch {
				case err != nil, r.status == http.StatusServiceUnavailable, r.status == http.StatusAccepted, r.status == http.StatusConflict:
					if r != nil && r.status == http.StatusServiceUnavailable {
						mu.Lock()
						unavailable++
						mu.Unlock()
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
				statuses[i] = r.status
				mu.Lock()
				if finished++; finished == refunds/4 {
					done.Do(func() { close(half) })
				}
				mu.Unlock()
				return
			}
		}()
	}
	select {
	case <-half:
	case <-time.After(time.Minute):
		t.Fatal("the refunds did not start")
	}
	mu.Lock()
	killed = time.Now()
	mu.Unlock()
	require.NoError(t, primary.Kill(ctx))
	require.NoError(t, standby.Promote(ctx))
	promoted := time.Now()
	wg.Wait()
	t.Logf("answers 503 meanwhile: %d", unavailable)
	t.Logf("standby promoted %s after the kill", promoted.Sub(killed).Round(time.Millisecond))
	if !firstAfter.IsZero() {
		t.Logf("from the kill to the first success of a request sent after it: %s", firstAfter.Sub(killed).Round(time.Millisecond))
	}

	// In flight at the kill: first sent before it, not answered 201 by then.
	var after []time.Duration
	for i, s := range statuses {
		require.Equal(t, http.StatusCreated, s, "refund %d", i)
		if first[i].Before(killed) && created[i].After(killed) {
			after = append(after, created[i].Sub(promoted))
		}
	}
	require.NotEmpty(t, after, "no refund was in flight at the kill")
	slices.Sort(after)
	pick := func(q float64) time.Duration { return after[int(q*float64(len(after)-1))].Round(time.Millisecond) }
	t.Logf("refunds in flight at the kill: %d; answered 201 after the promotion: median %s, p90 %s, slowest %s (lease %s)",
		len(after), pick(0.5), pick(0.9), pick(1), defaults.lease)
	// A bound on the takeover, not a speed: a refund that waited out its
	// lease would be answered about 15 s after the kill.
	require.Less(t, after[len(after)-1], 5*time.Second, "a refund in flight at the kill waited for its lease")
	require.Len(t, c.providerRefunds(), refunds, "one provider refund per refund")
	c.requireBooks(100*refunds, 100*refunds)
	rep := d.reconcile(t)
	require.Empty(t, rep.Mismatches, "the books and the provider agree")
	require.EqualValues(t, refunds, rep.Checked)
}
