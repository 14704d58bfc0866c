package main

// TestChaos's traffic and checks of the entry points beyond HTTP: the
// provider's webhooks (every refund makes one; the driver redelivers them all
// now and then), queued orders (one iteration of a client goroutine in
// chaosQueueOneIn), and settlements (every demo fires every slot).

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

const (
	// chaosQueueOneIn: one iteration of a client goroutine in this many sends
	// a queued order instead of an order and its refunds.
	chaosQueueOneIn = 5
	// chaosRedeliverEvery bounds the pause between two redeliveries of every
	// webhook event.
	chaosRedeliverEvery = 3 * time.Second
	// chaosRepost is how long a producer waits for its message to be consumed
	// before it sends it again: a delivery that a killed process was working
	// on stays running until River rescues it, after an hour.
	chaosRepost = 3 * time.Second
)

// chaosEntryArgs are the demos' flags of the entry points: a copy of every
// queued message, and a settlement every 2 seconds.
var chaosEntryArgs = []string{"-queue-duplicates", "1", "-settlement-interval", "2s"}

// chaosEntryCounts are the entry points' counters of a run.
type chaosEntryCounts struct {
	queued, queuePosts, queueReposts atomic.Int64
	redeliveries, redeliveredCopies  atomic.Int64
	events, eventDeliveries          atomic.Int64
	settlements, settledPositive     atomic.Int64
}

// scope is the engine scope of the key's operation.
func (k *chaosKey) scope() string {
	if k.path == "/queue/orders" {
		return "queue:" + chaosClients[k.client].name
	}
	return chaosClients[k.client].name
}

// queueOrder sends an order as a queued message, as a producer does, until
// the consumer has made it: again after chaosRepost without it done, and
// after any failure. Its final answer is the message's done GET, which counts
// as a 201.
func (r *chaosRun) queueOrder(w, n, client int, rng *rand.Rand) {
	k := &chaosKey{
		client: client, path: "/queue/orders", key: "msg-" + newKey(),
		orderID:    fmt.Sprintf("Q%d-%d", w, n),
		customerID: fmt.Sprintf("cus_%d", rng.IntN(4)),
		amount:     int64(1000 + rng.IntN(9000)),
	}
	r.mu.Lock()
	r.keys = append(r.keys, k)
	r.mu.Unlock()
	r.entry.queued.Add(1)
	token := chaosClients[client].token
	body, err := json.Marshal(map[string]any{"messageId": k.key, "orderId": k.orderID, "customerId": k.customerID, "amount": k.amount})
	require.NoError(r.t, err)
	k.first = time.Now()
	var posted time.Time
	for {
		if r.pastDeadline() {
			k.stuck = fmt.Sprintf("not consumed %s after the faults stopped", chaosRecovery)
			return
		}
		if time.Since(posted) > chaosRepost {
			resp, err := r.send(r.ctx, r.base(rng), http.MethodPost, "/queue/orders", token, "", body, 2*time.Second)
			r.requests.Add(1)
			k.requests++
			switch {
			case err == nil && resp.status == http.StatusAccepted:
				if !posted.IsZero() {
					r.entry.queueReposts.Add(1)
				}
				posted = time.Now()
				r.entry.queuePosts.Add(1)
			case err == nil && resp.status < 500:
				r.broken(false, true, "%s: POST %d %s", k, resp.status, resp.body)
				return
			default:
				k.interrupted = true
			}
		}
		if !posted.IsZero() {
			resp, err := r.send(r.ctx, r.base(rng), http.MethodGet, "/queue/orders/"+url.PathEscape(k.key), token, "", nil, 2*time.Second)
			if err == nil && resp.status == http.StatusOK {
				var m queueMessage
				require.NoError(r.t, json.Unmarshal(resp.body, &m), "%s", resp.body)
				switch {
				case m.Status == "done" && (m.Error != nil || m.OperationID == nil):
					r.broken(false, true, "%s: done with %s", k, resp.body)
					return
				case m.Status == "done":
					k.opIDs = []string{*m.OperationID}
					k.final = &response{status: http.StatusCreated, header: resp.header, body: resp.body}
					k.done = time.Now()
					return
				case m.Status == "rejected":
					r.broken(false, true, "%s: rejected: %s", k, resp.body)
					return
				}
			}
		}
		time.Sleep(time.Duration(50+rng.IntN(100)) * time.Millisecond)
	}
}

// redeliverWebhooks asks the provider, until the faults stop, to send every
// event made so far once or twice more, the copies of an event at once.
func (r *chaosRun) redeliverWebhooks() {
	rng := rand.New(rand.NewPCG(r.seed, 0xeb))
	for !r.stopping.Load() && r.ctx.Err() == nil {
		time.Sleep(time.Duration(rng.Int64N(int64(chaosRedeliverEvery))))
		copies := 1 + rng.IntN(2)
		resp, err := r.send(r.ctx, r.base(rng), http.MethodPost, "/provider/webhooks/redeliver", "", "",
			[]byte(fmt.Sprintf(`{"copies": %d}`, copies)), 5*time.Second)
		if err != nil || resp.status != http.StatusOK {
			continue // a demo killed, the database down: another time
		}
		var got struct{ Sent int }
		_ = json.Unmarshal(resp.body, &got)
		r.entry.redeliveries.Add(1)
		r.entry.redeliveredCopies.Add(int64(got.Sent))
	}
}

// paidOut is what settlements paid out of the client's merchant account: the
// sum of its payout accounts.
func paidOut(accounts []account) int64 {
	var paid int64
	for _, a := range accounts {
		if strings.HasPrefix(a.Account, "payout:") {
			paid += a.Balance
		}
	}
	return paid
}

// checkEntryPoints checks, once every key was answered, what the entry points
// did: every provider event delivered and applied once, every succeeded
// refund confirmed once; every settlement moved its balance once.
func (r *chaosRun) checkEntryPoints() {
	t, ctx := r.t, r.ctx
	// The provider sends every event until it gets a 2xx: with the faults
	// over, each gets there.
	var events []webhookEvent
	for {
		resp, err := r.send(ctx, r.base(r.rng), http.MethodGet, "/provider/webhooks", "", "", nil, 5*time.Second)
		if err == nil && resp.status == http.StatusOK {
			var body struct{ Events []webhookEvent }
			require.NoError(t, json.Unmarshal(resp.body, &body))
			events = body.Events
			undelivered := 0
			for _, ev := range events {
				if !ev.Delivered {
					undelivered++
				}
			}
			if undelivered == 0 {
				break
			}
			if r.pastDeadline() {
				r.broken(false, true, "%d of %d webhook events undelivered %s after the faults stopped", undelivered, len(events), chaosRecovery)
				break
			}
		}
		time.Sleep(pollInterval)
	}
	r.entry.events.Store(int64(len(events)))
	for _, ev := range events {
		r.entry.eventDeliveries.Add(int64(ev.Deliveries))
	}

	conn, err := pgx.Connect(ctx, r.dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	count := func(query string, args ...any) int64 {
		var n int64
		require.NoError(t, conn.QueryRow(ctx, query, args...).Scan(&n), "%s", query)
		return n
	}
	// The endpoint records each event, with its outcome in the engine's
	// inbox, in one transaction: once each.
	if n, kept := count("SELECT count(*) FROM demo_provider_event"), count("SELECT count(DISTINCT event_id) FROM idemflow_outcome"); n != int64(len(events)) || kept != n {
		r.broken(n > int64(len(events)) || kept > int64(len(events)), n < int64(len(events)) || kept < int64(len(events)),
			"%d webhook events made, %d recorded, %d in the inbox", len(events), n, kept)
	}
	if n := count("SELECT count(*) FROM idemflow_operation WHERE scope = 'webhook:provider' OR name = 'provider_event'"); n > 0 {
		r.broken(true, false, "%d webhook events started an operation", n)
	}
	succeeded := count("SELECT count(*) FROM demo_refund WHERE status = 'succeeded'")
	confirmed := count(`SELECT count(*) FROM demo_refund r JOIN demo_refund_confirmation c ON c.refund_id = r.id
		WHERE r.status = 'succeeded' AND c.confirmed_at IS NOT NULL AND c.provider_refund_id = r.provider_refund_id`)
	if confirmed != succeeded {
		r.broken(false, true, "%d succeeded refunds, %d confirmed by the provider's webhook", succeeded, confirmed)
	}
	if n := count("SELECT count(*) FROM demo_refund_confirmation WHERE confirmed_at IS NOT NULL") - confirmed; n != 0 {
		r.broken(true, false, "%d confirmations of no succeeded refund", n)
	}

	// Settlements: none failed (a slot fired twice is no failure: it finds
	// its key), and each moved its amount once, to its own payout account.
	if n := count("SELECT count(*) FROM idemflow_operation WHERE name = 'settlement' AND state = 'failed'"); n > 0 {
		r.broken(false, true, "%d settlements failed", n)
	}
	if n := count(`SELECT count(*) FROM demo_settlement s
		LEFT JOIN (SELECT client, account, sum(amount) AS balance, count(DISTINCT move_id) AS moves FROM demo_ledger_entry
		           WHERE kind = 'settlement' AND account LIKE 'payout:%' GROUP BY client, account) p
		  ON p.client = s.client AND p.account = 'payout:' || to_char(s.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
		WHERE coalesce(p.balance, 0) <> s.amount OR coalesce(p.moves, 0) <> CASE WHEN s.amount > 0 THEN 1 ELSE 0 END`); n > 0 {
		r.broken(true, false, "%d settlements did not move their amount exactly once", n)
	}
	if n := count(`SELECT count(*) FROM (SELECT DISTINCT client, account FROM demo_ledger_entry WHERE kind = 'settlement' AND account LIKE 'payout:%') p
		WHERE NOT EXISTS (SELECT 1 FROM demo_settlement s WHERE s.client = p.client
		                  AND p.account = 'payout:' || to_char(s.slot AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))`); n > 0 {
		r.broken(true, false, "%d payout accounts of no settlement", n)
	}
	r.entry.settlements.Store(count("SELECT count(*) FROM demo_settlement"))
	r.entry.settledPositive.Store(count("SELECT count(*) FROM demo_settlement WHERE amount > 0"))
}

// entryReport is the report's line of the entry points.
func (r *chaosRun) entryReport() string {
	e := &r.entry
	return fmt.Sprintf("  entry points:       %d queued orders (%d posts, %d again after %s unconsumed; 1 copy each); %d webhook events, %d deliveries, %d redeliveries of all (%d copies); %d settlements (%d of a positive balance)",
		e.queued.Load(), e.queuePosts.Load(), e.queueReposts.Load(), chaosRepost, e.events.Load(), e.eventDeliveries.Load(),
		e.redeliveries.Load(), e.redeliveredCopies.Load(), e.settlements.Load(), e.settledPositive.Load())
}
