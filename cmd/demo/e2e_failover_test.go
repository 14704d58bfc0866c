package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

// TestFailover: the demo on a primary with a synchronous standby, connected
// by a multi-host DATABASE_URL. Under refunds, the primary is killed
// (SIGKILL) and the standby promoted: requests meanwhile answer 503 (or 202)
// and are retried with their keys; the demo serves again by itself, without a
// restart; every refund is made exactly once, and the books and the provider
// agree (a reconciliation finds nothing).
func TestFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := pgcluster.Replicated(t, true)

	d := startDemo(t, pgcluster.MultiHostURL(primary, standby, "postgres"), &demoOpts{args: []string{"-reconcile-interval", "0"}})
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
	for i := range refunds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("failover-refund-%d", i)
			body := map[string]any{"orderId": "F-1", "amount": 100}
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				sent := time.Now()
				r, err := c.send(http.MethodPost, "/refunds", key, body)
				if err == nil && r.status == http.StatusCreated {
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
	wg.Wait()
	t.Logf("answers 503 meanwhile: %d", unavailable)
	if !firstAfter.IsZero() {
		t.Logf("from the kill to the first success of a request sent after it: %s", firstAfter.Sub(killed).Round(time.Millisecond))
	}

	for i, s := range statuses {
		require.Equal(t, http.StatusCreated, s, "refund %d", i)
	}
	require.Len(t, c.providerRefunds(), refunds, "one provider refund per refund")
	c.requireBooks(100*refunds, 100*refunds)
	rep := d.reconcile(t)
	require.Empty(t, rep.Mismatches, "the books and the provider agree")
	require.EqualValues(t, refunds, rep.Checked)
}
