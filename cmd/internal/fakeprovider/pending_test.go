package fakeprovider_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/entry/webhook"
)

// settleWithin bounds the waits for what happens in the background: a refund
// settling, an event arriving.
const settleWithin = 15 * time.Second

// pendingLong is a pending fault's delay that no test waits out: a test that
// wants the refund settled moves its time forward (due).
const pendingLong = 10 * time.Minute

// hooks is a webhook endpoint that checks each delivery's signature and keeps
// the events that it receives.
type hooks struct {
	url    string
	secret []byte

	mu  sync.Mutex
	got []hookEvent
	// bad counts the deliveries refused: a wrong signature or body.
	bad int
}

// hookEvent is a webhook event as it arrives, every field known.
type hookEvent struct {
	ID   string   `json:"id"`
	Type string   `json:"type"`
	Data hookData `json:"data"`
}

type hookData struct {
	RefundID       string `json:"refundId"`
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        string `json:"orderId"`
	Amount         int64  `json:"amount"`
	Status         string `json:"status"`
}

func newHooks(t *testing.T) *hooks {
	t.Helper()
	h := &hooks{secret: []byte("whsec_test")}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = webhook.SignatureVerifier{}.Verify(r, body, [][]byte{h.secret}, time.Now())
		}
		var ev hookEvent
		if err == nil {
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			err = dec.Decode(&ev)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if err != nil {
			h.bad++
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.got = append(h.got, ev)
	}))
	t.Cleanup(ts.Close)
	h.url = ts.URL
	return h
}

// config is a provider's configuration that sends its webhooks here.
func (h *hooks) config() *fakeprovider.Config {
	return &fakeprovider.Config{
		WebhookURL: h.url, WebhookSecret: h.secret,
		WebhookRetryBase: 10 * time.Millisecond, WebhookRetryCap: 100 * time.Millisecond,
	}
}

// of returns the deliveries received for the refund refundID.
func (h *hooks) of(refundID string) []hookEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hookEvent
	for _, ev := range h.got {
		if ev.Data.RefundID == refundID {
			out = append(out, ev)
		}
	}
	return out
}

// eventOf waits for the event of the refund refundID and returns it: every
// delivery of it must be the same event, and none may have been refused.
func (h *hooks) eventOf(t *testing.T, refundID string) hookEvent {
	t.Helper()
	waitUntil(t, "the event of refund "+refundID, func() bool { return len(h.of(refundID)) > 0 })
	evs := h.of(refundID)
	for _, ev := range evs[1:] {
		require.Equal(t, evs[0], ev, "every delivery is the same event")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Zero(t, h.bad, "deliveries refused")
	return evs[0]
}

// listedEvent is an event as GET /webhooks lists it.
type listedEvent struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	Deliveries int    `json:"deliveries"`
	Delivered  bool   `json:"delivered"`
}

func (b *bundle) webhooks(t *testing.T) []listedEvent {
	t.Helper()
	a := b.do(t, http.MethodGet, "/webhooks", nil, "")
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	var got struct {
		Events []listedEvent `json:"events"`
	}
	require.NoError(t, json.Unmarshal(a.body, &got))
	require.NotNil(t, got.Events)
	return got.Events
}

// due moves the time of the pending refund id to now, as if its delay had
// passed, rather than have the test wait it out.
func (b *bundle) due(t *testing.T, id string) {
	t.Helper()
	tag, err := b.pool.Exec(t.Context(),
		"UPDATE provider.refund SET settles_at = clock_timestamp() WHERE id = $1 AND status = 'pending'", id)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "refund %s is not pending", id)
}

// statusInDB reads the status of the refund id from the database itself,
// settling nothing.
func (b *bundle) statusInDB(t *testing.T, id string) string {
	t.Helper()
	var status string
	require.NoError(t, b.pool.QueryRow(t.Context(), "SELECT status FROM provider.refund WHERE id = $1", id).Scan(&status))
	return status
}

// refundAs posts a refund that must be answered 200 with status, and returns
// its id.
func (b *bundle) refundAs(t *testing.T, key, orderID string, amount int64, status string) (string, answer) {
	t.Helper()
	a := b.refund(t, key, orderID, amount)
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	var got struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(a.body, &got))
	require.True(t, strings.HasPrefix(got.ID, fakeprovider.IDPrefix), got.ID)
	require.Equal(t, status, got.Status, "body: %s", a.body)
	return got.ID, a
}

// TestPending: a refund made under the fault "pending" is answered pending,
// stays so (in a repeat, the lookup and the list, with no event) until its
// time comes, then becomes its outcome, and its event is sent.
func TestPending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault string
		// waited: the test waits the delay out (a short one) rather than move
		// the refund's time forward, and looks at nothing meanwhile.
		waited    bool
		status    string
		eventType string
	}{
		{"SucceedsByDefault", fmt.Sprintf(`{"mode": "pending", "delayMs": %d}`, pendingLong.Milliseconds()),
			false, fakeprovider.StatusSucceeded, fakeprovider.EventRefundSucceeded},
		{"Succeeds", fmt.Sprintf(`{"mode": "pending", "count": 1, "delayMs": %d, "outcome": "succeeded"}`, pendingLong.Milliseconds()),
			false, fakeprovider.StatusSucceeded, fakeprovider.EventRefundSucceeded},
		{"Fails", fmt.Sprintf(`{"mode": "pending", "count": 1, "delayMs": %d, "outcome": "failed"}`, pendingLong.Milliseconds()),
			false, fakeprovider.StatusFailed, fakeprovider.EventRefundFailed},
		{"SucceedsInTime", `{"mode": "pending", "delayMs": 100}`,
			true, fakeprovider.StatusSucceeded, fakeprovider.EventRefundSucceeded},
		{"FailsInTime", `{"mode": "pending", "delayMs": 100, "outcome": "failed"}`,
			true, fakeprovider.StatusFailed, fakeprovider.EventRefundFailed},
		{"FailsAtOnce", `{"mode": "pending", "delayMs": 0, "outcome": "failed"}`,
			true, fakeprovider.StatusFailed, fakeprovider.EventRefundFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHooks(t)
			b := serveWith(t, migrated(t), h.config())
			b.run(t)
			b.fault(t, tc.fault)
			id, first := b.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusPending)
			require.Empty(t, first.header.Get("Idempotent-Replayed"))
			require.JSONEq(t, fmt.Sprintf(`{"id": %q, "status": "pending", "orderId": "A-1", "amount": 1499}`, id), string(first.body))
			requests := 1

			if !tc.waited {
				// Meanwhile it is pending wherever it shows, and has no event.
				again, a := b.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusPending)
				requests++
				require.Equal(t, id, again)
				require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
				got := b.byKey(t, "key-1")
				require.Equal(t, id, got.ID)
				require.Equal(t, fakeprovider.StatusPending, got.Status)
				require.Equal(t, requests, got.Requests)
				listed := b.list(t)
				require.Len(t, listed, 1)
				require.Equal(t, got, listed[0])
				require.Empty(t, b.webhooks(t), "no event for a pending refund")
				require.Empty(t, h.of(id))
				b.due(t, id)
			}

			// The settler makes it its outcome, and its event goes out.
			ev := h.eventOf(t, id)
			require.True(t, strings.HasPrefix(ev.ID, fakeprovider.EventIDPrefix), ev.ID)
			require.Equal(t, hookEvent{ID: ev.ID, Type: tc.eventType, Data: hookData{
				RefundID: id, IdempotencyKey: "key-1", OrderID: "A-1", Amount: 1499, Status: tc.status,
			}}, ev)
			waitUntil(t, "the event recorded as delivered", func() bool {
				evs := b.webhooks(t)
				return len(evs) == 1 && evs[0].Delivered
			})
			evs := b.webhooks(t)
			require.Equal(t, ev.ID, evs[0].ID)
			require.Equal(t, tc.eventType, evs[0].Type)

			// From then on it answers with its outcome, for good.
			got := b.byKey(t, "key-1")
			require.Equal(t, tc.status, got.Status)
			again, a := b.refundAs(t, "key-1", "A-1", 1499, tc.status)
			requests++
			require.Equal(t, id, again)
			require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
			listed := b.list(t)
			require.Len(t, listed, 1)
			require.Equal(t, tc.status, listed[0].Status)
			require.Equal(t, requests, listed[0].Requests)
			require.Len(t, b.webhooks(t), 1, "one event per refund")

			// The fault was used up: the next refund succeeds at once.
			other, _ := b.refundAs(t, "key-2", "A-2", 10, fakeprovider.StatusSucceeded)
			require.Equal(t, fakeprovider.StatusSucceeded, h.eventOf(t, other).Data.Status)
		})
	}
}

// TestPendingSettledByAReader: with no settler running, a pending refund
// whose time has come is settled by the first request that shows it, and its
// event is made then, to be sent by the next sender.
func TestPendingSettledByAReader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		read func(t *testing.T, b *bundle) string // the status it shows
	}{
		{"Lookup", func(t *testing.T, b *bundle) string { return b.byKey(t, "key-1").Status }},
		{"List", func(t *testing.T, b *bundle) string {
			p := b.listPage(t, "limit=10")
			require.Len(t, p.Refunds, 1)
			return p.Refunds[0].Status
		}},
		{"Repeat", func(t *testing.T, b *bundle) string {
			a := b.refund(t, "key-1", "A-1", 1499)
			require.Equal(t, http.StatusOK, a.status)
			var got struct{ Status string }
			require.NoError(t, json.Unmarshal(a.body, &got))
			return got.Status
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHooks(t)
			b := serveWith(t, migrated(t), h.config())
			b.fault(t, fmt.Sprintf(`{"mode": "pending", "delayMs": %d, "outcome": "failed"}`, pendingLong.Milliseconds()))
			id, _ := b.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusPending)
			require.Equal(t, fakeprovider.StatusPending, tc.read(t, b))
			b.due(t, id)
			require.Equal(t, fakeprovider.StatusFailed, tc.read(t, b))
			require.Equal(t, fakeprovider.StatusFailed, b.statusInDB(t, id))
			evs := b.webhooks(t)
			require.Len(t, evs, 1, "made by the read that settled the refund")
			require.Equal(t, fakeprovider.EventRefundFailed, evs[0].Type)
			require.Zero(t, evs[0].Deliveries)

			b.run(t)
			ev := h.eventOf(t, id)
			require.Equal(t, evs[0].ID, ev.ID)
			require.Equal(t, fakeprovider.EventRefundFailed, ev.Type)
			require.Equal(t, fakeprovider.StatusFailed, ev.Data.Status)
		})
	}
}

// TestPendingSurvivesARestart: a process records a refund as pending and
// dies before it settles it; another process on the database settles it, and
// sends its event.
func TestPendingSurvivesARestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// delay is the pending fault's. A long one is moved forward once the
		// second process runs (the refund comes due under it); a zero one is
		// due before the second process starts.
		delay time.Duration
		// ran: the first process ran its settler before it died.
		ran bool
	}{
		{"DueBeforeTheRestart", 0, false},
		{"DueAfterTheRestart", pendingLong, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := migrated(t)
			h := newHooks(t)
			first := serveWith(t, pool, h.config())
			stop := func() {}
			if tc.ran {
				stop = first.run(t)
			}
			first.fault(t, fmt.Sprintf(`{"mode": "pending", "delayMs": %d}`, tc.delay.Milliseconds()))
			id, _ := first.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusPending)
			// The first process dies.
			stop()
			first.close()
			require.Equal(t, fakeprovider.StatusPending, first.statusInDB(t, id), "nobody settled it before the restart")

			second := serveWith(t, pool, h.config())
			second.run(t)
			if tc.delay > 0 {
				second.due(t, id)
			}
			ev := h.eventOf(t, id)
			require.Equal(t, fakeprovider.EventRefundSucceeded, ev.Type)
			require.Equal(t, hookData{RefundID: id, IdempotencyKey: "key-1", OrderID: "A-1", Amount: 1499, Status: fakeprovider.StatusSucceeded}, ev.Data)
			require.Equal(t, fakeprovider.StatusSucceeded, second.byKey(t, "key-1").Status)
			again, _ := second.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusSucceeded)
			require.Equal(t, id, again)
		})
	}
}

// TestPendingUnderTwoSettlers: two processes settle the pending refunds of one
// database at once; each refund settles once, with one event.
func TestPendingUnderTwoSettlers(t *testing.T) {
	t.Parallel()
	pool := migrated(t)
	h := newHooks(t)
	a := serveWith(t, pool, h.config())
	other := serveWith(t, pool, h.config())
	const n = 30
	a.fault(t, fmt.Sprintf(`{"mode": "pending", "count": %d, "delayMs": 0, "outcome": "failed"}`, n))
	ids := make([]string, n)
	for i := range n {
		ids[i], _ = a.refundAs(t, fmt.Sprintf("key-%d", i), "A-1", int64(i+1), fakeprovider.StatusPending)
	}
	a.run(t)
	other.run(t)
	for _, id := range ids {
		ev := h.eventOf(t, id)
		require.Equal(t, fakeprovider.EventRefundFailed, ev.Type)
	}
	evs := a.webhooks(t)
	require.Len(t, evs, n, "one event per refund")
	for _, r := range a.list(t) {
		require.Equal(t, fakeprovider.StatusFailed, r.Status)
	}
}

// TestEventOfARefundMadeAtOnce: a refund that succeeds at once has its event
// at once, with the status succeeded.
func TestEventOfARefundMadeAtOnce(t *testing.T) {
	t.Parallel()
	h := newHooks(t)
	b := serveWith(t, migrated(t), h.config())
	b.run(t)
	id, _ := b.refundAs(t, "key-1", "A-1", 1499, fakeprovider.StatusSucceeded)
	ev := h.eventOf(t, id)
	require.Equal(t, hookEvent{ID: ev.ID, Type: fakeprovider.EventRefundSucceeded, Data: hookData{
		RefundID: id, IdempotencyKey: "key-1", OrderID: "A-1", Amount: 1499, Status: fakeprovider.StatusSucceeded,
	}}, ev)
}
