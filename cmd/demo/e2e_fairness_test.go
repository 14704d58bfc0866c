package main

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestMaxInFlightPerClient: with -max-in-flight-per-client 1, a client whose
// refund is still running gets 429 too_many_requests for its next one, with
// Retry-After and its key free, while the other client is served.
func TestMaxInFlightPerClient(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), &demoOpts{args: []string{"-max-in-flight-per-client", "1", "-wait", "200ms"}})
	a, b := d.client(t, tokenA), d.client(t, tokenB)
	a.createOrder("A-1", "cus_1", 5000)
	b.createOrder("B-1", "cus_2", 5000)
	a.setFault("slow", 1, 3000) // a's first refund stays in flight

	first := a.post("/refunds", newKey(), map[string]any{"orderId": "A-1", "amount": 100})
	requireStatus(t, first, http.StatusAccepted)
	key := newKey()
	busy := a.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 200})
	requireError(t, busy, http.StatusTooManyRequests, "too_many_requests")
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	served := b.post("/refunds", newKey(), map[string]any{"orderId": "B-1", "amount": 300})
	requireStatus(t, served, http.StatusCreated)

	// Once its refund ended, the refused key is served: it was never taken.
	require.Eventually(t, func() bool {
		r := a.post("/refunds", key, map[string]any{"orderId": "A-1", "amount": 200})
		return r.status == http.StatusCreated
	}, 30*time.Second, 100*time.Millisecond)
	d.stop()
}

// TestMaxInFlightPerClientAcrossProcesses measures the documented bound of a
// client across processes: each process bounds it on its own, so two demos
// with -max-in-flight-per-client 2 on one database let it have 2 × 2 = 4
// refunds in flight, no more. Eight refunds at once, four to each demo, while
// the provider is slow: four are accepted (two in each process) and four
// refused with 429 and their keys free; the database never holds more than
// four of the client's operations in progress; once those end, the refused
// keys are served.
func TestMaxInFlightPerClientAcrossProcesses(t *testing.T) {
	t.Parallel()
	const perProcess, processes, sent = 2, 2, 8
	dbURL := testdb.URL(t)
	args := []string{"-max-in-flight-per-client", strconv.Itoa(perProcess), "-wait", "200ms"}
	demos := make([]*demo, processes)
	for i := range demos {
		demos[i] = startDemo(t, dbURL, &demoOpts{args: args, noWait: true})
	}
	for _, d := range demos {
		d.waitListening()
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })
	a := demos[0].client(t, tokenA)
	a.createOrder("X-1", "cus_1", 100000)
	a.setFault("slow", sent, 3000) // every accepted refund stays in flight

	// The most operations of the client in progress at once, sampled until
	// stop is closed.
	var most atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var n int64
			if conn.QueryRow(context.WithoutCancel(t.Context()),
				`SELECT count(*) FROM idemflow_operation WHERE state = 'in_progress'`).Scan(&n) == nil && n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	keys := make([]string, sent)
	answers := make([]*response, sent)
	var wg sync.WaitGroup
	for i := range keys {
		keys[i] = newKey()
		c := demos[i%processes].client(t, tokenA)
		wg.Go(func() {
			answers[i], _ = c.send(http.MethodPost, "/refunds", keys[i], map[string]any{"orderId": "X-1", "amount": 100 + i})
		})
	}
	wg.Wait()
	accepted := map[int]int{} // by process
	var refused []int
	for i, r := range answers {
		require.NotNil(t, r, "refund %d got no answer", i)
		switch r.status {
		case http.StatusAccepted:
			accepted[i%processes]++
		case http.StatusTooManyRequests:
			requireError(t, r, http.StatusTooManyRequests, "too_many_requests")
			refused = append(refused, i)
		default:
			t.Fatalf("refund %d: status %d, want 202 or 429: %s", i, r.status, r.body)
		}
	}
	require.Equal(t, map[int]int{0: perProcess, 1: perProcess}, accepted, "each process takes the client's bound")
	require.Len(t, refused, sent-perProcess*processes)

	// Once the accepted refunds end, each refused key is served: none was taken.
	for _, i := range refused {
		c := demos[i%processes].client(t, tokenA)
		require.Eventually(t, func() bool {
			r := c.post("/refunds", keys[i], map[string]any{"orderId": "X-1", "amount": 100 + i})
			return r.status == http.StatusCreated || r.status == http.StatusAccepted
		}, 60*time.Second, 200*time.Millisecond)
	}
	close(stop)
	<-sampled
	require.LessOrEqual(t, most.Load(), int64(perProcess*processes), "the client never had more in flight than the processes' bounds together")
	require.Positive(t, most.Load())
	t.Logf("most of the client's operations in progress at once: %d (bound %d × %d processes)", most.Load(), perProcess, processes)
	for _, d := range demos {
		d.stop()
	}
}
