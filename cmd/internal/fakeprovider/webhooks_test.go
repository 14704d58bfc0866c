package fakeprovider_test

import (
	"context"
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
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestWebhooksOnceEachUnderTwoSenders: two provider processes send the events
// of 40 refunds to a slow endpoint (300 ms a POST, within the 500 ms timeout),
// and each event arrives once. A sender claims an event for a timeout and a
// fifth; one that claimed more events than it has POSTs in flight let the
// claims of those waiting behind the others run out, and the other sender sent
// them again.
func TestWebhooksOnceEachUnderTwoSenders(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pool := testdb.Pool(t)
	require.NoError(t, fakeprovider.Migrate(ctx, pool))

	var mu sync.Mutex
	got := map[string]int{}
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			ID string `json:"id"`
		}
		raw, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(raw, &ev); err != nil || ev.ID == "" {
			http.Error(w, "no event id", http.StatusBadRequest)
			return
		}
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		got[ev.ID]++
		mu.Unlock()
	}))
	defer endpoint.Close()

	cfg := &fakeprovider.Config{
		WebhookURL: endpoint.URL, WebhookSecret: []byte("whsec_test"),
		WebhookTimeout: 500 * time.Millisecond,
	}
	var senders []*fakeprovider.Server
	for range 2 {
		s, err := fakeprovider.New(pool, cfg)
		require.NoError(t, err)
		senders = append(senders, s)
	}
	api := httptest.NewServer(senders[0].Handler())
	defer api.Close()
	const refunds = 40
	for i := range refunds {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/refunds",
			strings.NewReader(fmt.Sprintf(`{"orderId": "o-%d", "amount": 100, "reference": "re_%d"}`, i, i)))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", fmt.Sprintf("k-%d", i))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	var wg sync.WaitGroup
	for _, s := range senders {
		wg.Go(func() { _ = s.RunWebhooks(ctx) })
	}
	delivered := func() (events, posts int) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range got {
			posts += n
		}
		return len(got), posts
	}
	require.Eventually(t, func() bool { events, _ := delivered(); return events == refunds },
		20*time.Second, 50*time.Millisecond)
	time.Sleep(time.Second) // a claim that ran out would be sent again meanwhile
	cancel()
	wg.Wait()
	events, posts := delivered()
	require.Equal(t, refunds, events)
	require.Equal(t, refunds, posts, "POSTs of the %d events", refunds)
}
