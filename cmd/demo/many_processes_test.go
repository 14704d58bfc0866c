package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestManyProcesses runs three demos on one database and sends them a batch of
// refunds while the provider is slow, so that every operation is in flight in
// the process that received it. One process is killed (SIGKILL): the two others
// take its operations over once their lease expired, and the client, retrying
// its keys on the live processes, gets every final answer. Each operation ran in
// one process at a time: one provider refund per key, asked for once; one ledger
// move per refund; an operation of a live process, whose provider call outlasts
// the lease, is never taken from it; and the sweepers of the two survivors hand
// each dead operation to one River job.
func TestManyProcesses(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	demos := make([]*demo, 3)
	for i := range demos {
		demos[i] = startDemo(t, dbURL, &demoOpts{args: []string{"-wait", "300ms"}, noWait: true})
	}
	for _, d := range demos {
		d.waitListening()
	}
	victim, survivors := demos[0], demos[1:]
	a := survivors[0].client(t, tokenA)
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(t.Context())) })

	const (
		orders     = 3
		orderTotal = 3 * 10000
		perProcess = 4
		amount     = 700
	)
	for i := range orders {
		a.createOrder(fmt.Sprintf("M-%d", i), fmt.Sprintf("cus_%d", i), 10000)
	}

	type sent struct {
		key, orderID, opID string
		body               map[string]any
		dead               bool // received by the victim
	}
	// send posts n refunds at once, the i-th to demos[i%len(demos)], requires
	// that each answers 202 (its operation is in flight), then waits until the
	// provider took every injected fault: each request is at the provider.
	var all []*sent
	send := func(n int, demos []*demo, dead bool) {
		t.Helper()
		batch := make([]*sent, n)
		answers := make([]*response, n)
		var wg sync.WaitGroup
		for i := range batch {
			orderID := fmt.Sprintf("M-%d", (len(all)+i)%orders)
			batch[i] = &sent{key: newKey(), orderID: orderID, body: map[string]any{"orderId": orderID, "amount": amount}, dead: dead}
			c := demos[i%len(demos)].client(t, tokenA)
			wg.Go(func() { answers[i], _ = c.send(http.MethodPost, "/refunds", batch[i].key, batch[i].body) })
		}
		wg.Wait()
		for i, r := range answers {
			require.NotNil(t, r, "refund %d got no answer", i)
			requireStatus(t, r, http.StatusAccepted)
			batch[i].opID = r.header.Get("Operation-Id")
		}
		all = append(all, batch...)
		awaitFaultsTaken(t, conn)
	}

	// The victim's refunds: the provider, which the victim serves itself, sleeps
	// for minutes in each, so they are still running when the victim dies.
	a.setFault("slow", perProcess, 600_000)
	send(perProcess, []*demo{victim}, true)
	// The survivors' refunds: their provider calls outlast the lease, which the
	// survivors renew while they wait.
	a.setFault("slow", 2*perProcess, 2500)
	send(2*perProcess, survivors, false)

	victim.kill()

	// The client retries every key on the live processes until its final answer.
	for i, s := range all {
		c := survivors[i%len(survivors)].client(t, tokenA)
		r := c.postUntilFinal("/refunds", s.key, s.body)
		requireStatus(t, r, http.StatusCreated)
		require.Equal(t, s.opID, r.header.Get("Operation-Id"))
		ref := decodeAs[refundBody](t, r)
		require.Equal(t, "succeeded", ref.Status)
		require.Equal(t, int64(amount), ref.Amount)
	}

	// One refund at the provider per key, under the operation's derived key,
	// asked for once: the dead process's calls never reached it (they slept),
	// and the survivors' sweepers asked the lookup before calling again.
	refunds := a.providerRefunds()
	require.Len(t, refunds, len(all))
	byKey := map[string]providerRefund{}
	for _, pr := range refunds {
		byKey[pr.IdempotencyKey] = pr
	}
	for _, s := range all {
		op := a.getOperation(s.opID)
		pr, ok := byKey[op.Steps[1].DerivedKey]
		require.True(t, ok, "no provider refund for key %s", s.key)
		require.Equal(t, 1, pr.Requests, "key %s", s.key)
		require.Equal(t, s.orderID, pr.OrderID)
		require.Equal(t, int64(amount), pr.Amount)

		require.Equal(t, "succeeded", op.Status)
		require.Equal(t, 1, op.Steps[0].Attempts, "the ledger step of %s ran once", s.key)
	}

	// Runs: the first attempt, plus one resume for each operation of the dead
	// process; each of those was handed to one River job, whichever survivor's
	// sweeper found it.
	for _, s := range all {
		var runs, jobs int
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT runs FROM idemflow_operation WHERE id = $1", s.opID).Scan(&runs))
		require.NoError(t, conn.QueryRow(t.Context(),
			"SELECT count(*) FROM river_job WHERE kind = 'idemflow_resume' AND args->>'operation_id' = $1", s.opID).Scan(&jobs))
		if s.dead {
			require.Equal(t, 2, runs, "runs of %s, which the victim held", s.opID)
			require.Equal(t, 1, jobs, "resume jobs of %s", s.opID)
		} else {
			require.Equal(t, 1, runs, "runs of %s, which a live process held", s.opID)
			require.Zero(t, jobs, "resume jobs of %s", s.opID)
		}
	}

	// The books: each refund moved money once, and no move was reversed.
	a.requireBooks(orderTotal, int64(len(all)*amount))
	var moves, reversals int
	require.NoError(t, conn.QueryRow(t.Context(),
		"SELECT count(DISTINCT move_id) FILTER (WHERE kind = 'refund'), count(*) FILTER (WHERE kind = 'refund_reversal') FROM demo_ledger_entry").
		Scan(&moves, &reversals))
	require.Equal(t, len(all), moves)
	require.Zero(t, reversals)
	var refunded int64
	for i := range orders {
		o := a.getOrder(fmt.Sprintf("M-%d", i))
		for _, r := range o.Refunds {
			require.Equal(t, "succeeded", r.Status)
		}
		refunded += o.Refunded
	}
	require.Equal(t, int64(len(all)*amount), refunded)

	for _, d := range survivors {
		d.stop()
	}
}

// awaitFaultsTaken waits until the fake provider has no injected fault left:
// every request that was to take one reached it.
func awaitFaultsTaken(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	deadline := time.Now().Add(finalTimeout)
	for {
		var left int
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT coalesce(sum(remaining), 0) FROM provider.fault").Scan(&left))
		if left == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the provider still has %d faults to inject after %s", left, finalTimeout)
		time.Sleep(pollInterval)
	}
}
