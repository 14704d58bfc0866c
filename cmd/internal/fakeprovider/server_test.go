package fakeprovider_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/internal/testdb"
)

// bundle is a provider served for a test.
type bundle struct {
	pool *pgxpool.Pool
	srv  *fakeprovider.Server
	// url is the provider's base URL: a server that mounts it under /provider, as
	// the demo does.
	url string
	// close stops serving, as a process that dies does (see serveWith).
	close func()
}

// setup returns a provider on a database of its own, served under /provider.
func setup(t *testing.T) *bundle {
	t.Helper()
	return serveWith(t, migrated(t), nil)
}

// migrated returns a database of the test's own with the provider's schema.
func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	require.NoError(t, fakeprovider.Migrate(t.Context(), pool))
	return pool
}

// serve serves a new provider on pool under /provider and returns its base URL.
func serve(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	return serveWith(t, pool, nil).url
}

// serveWith serves a new provider on pool with cfg under /provider. The
// provider's background work (Run) is not started: see run.
func serveWith(t *testing.T, pool *pgxpool.Pool, cfg *fakeprovider.Config) *bundle {
	t.Helper()
	srv, err := fakeprovider.New(pool, cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/provider/", http.StripPrefix("/provider", srv.Handler()))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return &bundle{pool: pool, srv: srv, url: ts.URL + "/provider", close: ts.Close}
}

// run runs the provider's background work until the test ends or the
// returned function is called, which waits for it to stop.
func (b *bundle) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.srv.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitUntil polls cond, on the test's goroutine, until it holds: for at most
// settleWithin, then the test fails naming what.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(settleWithin)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", settleWithin, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// answer is an HTTP answer, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// errorCode returns the code of an error answer.
func (a answer) errorCode(t *testing.T) string {
	t.Helper()
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(a.body, &body), "body: %s", a.body)
	require.NotEmpty(t, body.Error.Message)
	return body.Error.Code
}

func (b *bundle) do(t *testing.T, method, path string, header http.Header, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: raw}
}

// refund posts a refund of amount for orderID under key.
func (b *bundle) refund(t *testing.T, key, orderID string, amount int64) answer {
	t.Helper()
	return b.do(t, http.MethodPost, "/refunds", http.Header{"Idempotency-Key": {key}},
		fmt.Sprintf(`{"orderId": %q, "amount": %d, "reference": "re_test"}`, orderID, amount))
}

// refundID posts a refund that must succeed, and returns the provider's id.
func (b *bundle) refundID(t *testing.T, key, orderID string, amount int64) string {
	t.Helper()
	a := b.refund(t, key, orderID, amount)
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	var got struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(a.body, &got))
	require.True(t, strings.HasPrefix(got.ID, fakeprovider.IDPrefix), got.ID)
	require.Equal(t, "succeeded", got.Status)
	return got.ID
}

func (b *bundle) fault(t *testing.T, body string) {
	t.Helper()
	a := b.do(t, http.MethodPost, "/faults", nil, body)
	require.Equal(t, http.StatusNoContent, a.status, "body: %s", a.body)
}

// record is a refund as the provider lists it.
type record struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        string    `json:"orderId"`
	Amount         int64     `json:"amount"`
	Status         string    `json:"status"`
	Requests       int       `json:"requests"`
	CreatedAt      time.Time `json:"createdAt"`
}

// page is an answer of GET /refunds.
type page struct {
	Refunds []record `json:"refunds"`
	Next    *string  `json:"next"`
}

// listPage answers GET /refunds?query, which must succeed, and checks its
// shape: "refunds" a list, "next" present (null or an id).
func (b *bundle) listPage(t *testing.T, query string) page {
	t.Helper()
	a := b.do(t, http.MethodGet, "/refunds?"+query, nil, "")
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	require.Equal(t, "application/json", a.header.Get("Content-Type"))
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(a.body, &raw))
	require.Contains(t, raw, "next", "body: %s", a.body)
	var got page
	dec := json.NewDecoder(strings.NewReader(string(a.body)))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&got))
	require.NotNil(t, got.Refunds)
	return got
}

// list answers every refund, oldest first.
func (b *bundle) list(t *testing.T) []record {
	t.Helper()
	got := b.listPage(t, "")
	require.Nil(t, got.Next, "no limit: one page")
	return got.Refunds
}

// byKey answers the refund made under key, which must exist.
func (b *bundle) byKey(t *testing.T, key string) record {
	t.Helper()
	a := b.do(t, http.MethodGet, "/refunds/by-key/"+url.PathEscape(key), nil, "")
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	var got record
	dec := json.NewDecoder(strings.NewReader(string(a.body)))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&got))
	return got
}

func TestRefund(t *testing.T) {
	t.Parallel()

	t.Run("SameKeySameRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.refundID(t, "key-1", "A-1", 1500)
		again := b.refund(t, "key-1", "A-1", 1500)
		require.Equal(t, http.StatusOK, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.JSONEq(t, fmt.Sprintf(`{"id": %q, "status": "succeeded", "orderId": "A-1", "amount": 1500}`, first), string(again.body))

		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, first, got[0].ID)
		require.Equal(t, "key-1", got[0].IdempotencyKey)
		require.Equal(t, "A-1", got[0].OrderID)
		require.Equal(t, int64(1500), got[0].Amount)
		require.Equal(t, 2, got[0].Requests)
		require.Equal(t, fakeprovider.StatusSucceeded, got[0].Status)
		require.False(t, got[0].CreatedAt.IsZero())
	})

	t.Run("SameKeyOtherBodySameRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.refundID(t, "key-1", "A-1", 1500)
		require.Equal(t, first, b.refundID(t, "key-1", "A-2", 99))
		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, int64(1500), got[0].Amount)
	})

	t.Run("EveryAnswerJSON", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, tc := range []struct {
			method, path string
			status       int
			code         string
		}{
			{http.MethodGet, "/nope", http.StatusNotFound, "not_found"},
			{http.MethodPut, "/refunds", http.StatusMethodNotAllowed, "method_not_allowed"},
			{http.MethodPost, "/refunds/by-key/k", http.StatusMethodNotAllowed, "method_not_allowed"},
			{http.MethodGet, "/faults", http.StatusMethodNotAllowed, "method_not_allowed"},
		} {
			a := b.do(t, tc.method, tc.path, nil, "")
			require.Equal(t, tc.status, a.status, "%s %s", tc.method, tc.path)
			require.Equal(t, "application/json", a.header.Get("Content-Type"))
			var body struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(a.body, &body), "%s", a.body)
			require.EqualValues(t, tc.code, body.Error.Code)
		}
	})

	t.Run("OtherKeyOtherRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first := b.refundID(t, "key-1", "A-1", 1500)
		second := b.refundID(t, "key-2", "A-1", 1500)
		require.NotEqual(t, first, second)
		got := b.list(t)
		require.Len(t, got, 2)
		require.Equal(t, []int{1, 1}, []int{got[0].Requests, got[1].Requests})
	})

	t.Run("ConcurrentSameKeyOneRefund", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 10
		ids := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				a := b.refund(t, "same", "A-1", 100)
				if a.status == http.StatusOK {
					var got struct{ ID string }
					_ = json.Unmarshal(a.body, &got)
					ids[i] = got.ID
				}
			})
		}
		wg.Wait()
		for _, id := range ids {
			require.Equal(t, ids[0], id)
		}
		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, n, got[0].Requests)
	})

	t.Run("DeclineRecordsNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.refund(t, "key-1", fakeprovider.DeclinePrefix+"7", 100)
		require.Equal(t, http.StatusPaymentRequired, a.status)
		require.Equal(t, "declined", a.errorCode(t))
		require.Empty(t, b.list(t))
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "").status)
	})

	t.Run("MissingKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.do(t, http.MethodPost, "/refunds", nil, `{"orderId": "A-1", "amount": 1}`)
		require.Equal(t, http.StatusBadRequest, a.status)
		require.Equal(t, "idempotency_key_missing", a.errorCode(t))
		a = b.refund(t, strings.Repeat("k", 256), "A-1", 1)
		require.Equal(t, http.StatusBadRequest, a.status)
		require.Equal(t, "idempotency_key_invalid", a.errorCode(t))
		require.Empty(t, b.list(t))
	})

	t.Run("BadBody", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, body := range []string{
			`not json`,
			`{"orderId": "A-1", "amount": 1, "extra": true}`,
			`{"amount": 1}`,
			`{"orderId": "A-1", "amount": 0}`,
			`{"orderId": "A-1", "amount": -5}`,
			`{"orderId": "A-1", "amount": "5"}`,
			`{"orderId": "A-1", "amount": 1.5}`,
			`{"orderId": "A-1", "amount": 1} {}`,
		} {
			a := b.do(t, http.MethodPost, "/refunds", http.Header{"Idempotency-Key": {"k"}}, body)
			require.Equal(t, http.StatusBadRequest, a.status, "body %s", body)
			require.Equal(t, "invalid_request", a.errorCode(t), "body %s", body)
		}
		require.Empty(t, b.list(t))
	})
}

func TestByKey(t *testing.T) {
	t.Parallel()

	t.Run("Found", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := "idf1_a/b?c#d%e"
		id := b.refundID(t, key, "A-1", 700)
		a := b.do(t, http.MethodGet, "/refunds/by-key/"+url.PathEscape(key), nil, "")
		require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
		var got record
		require.NoError(t, json.Unmarshal(a.body, &got))
		require.Equal(t, id, got.ID)
		require.Equal(t, key, got.IdempotencyKey)
		require.Equal(t, "A-1", got.OrderID)
		require.Equal(t, int64(700), got.Amount)
		require.Equal(t, fakeprovider.StatusSucceeded, got.Status)
		require.Equal(t, 1, got.Requests)
		require.Equal(t, got, b.byKey(t, key))
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.refundID(t, "key-1", "A-1", 700)
		for _, path := range []string{"/refunds/by-key/other", "/refunds/by-key/"} {
			a := b.do(t, http.MethodGet, path, nil, "")
			require.Equal(t, http.StatusNotFound, a.status, path)
			require.Equal(t, "refund_not_found", a.errorCode(t))
		}
	})
}

func TestList(t *testing.T) {
	t.Parallel()

	t.Run("EmptyIsAnEmptyList", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.do(t, http.MethodGet, "/refunds", nil, "")
		require.Equal(t, http.StatusOK, a.status)
		require.JSONEq(t, `{"refunds": [], "next": null}`, string(a.body))
		a = b.do(t, http.MethodGet, "/refunds?limit=10", nil, "")
		require.Equal(t, http.StatusOK, a.status)
		require.JSONEq(t, `{"refunds": [], "next": null}`, string(a.body))
	})

	t.Run("Pages", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 5
		var ids []string
		for i := range n {
			ids = append(ids, b.refundID(t, fmt.Sprintf("key-%d", i), "A-1", int64(i+1)))
		}
		all := b.list(t)
		require.Len(t, all, n)
		idsOf := func(rs []record) []string {
			out := make([]string, 0, len(rs))
			for _, r := range rs {
				out = append(out, r.ID)
			}
			return out
		}
		require.Equal(t, ids, idsOf(all), "oldest first")

		// Walks the pages of query with limit, and returns the ids in order.
		walk := func(t *testing.T, query string, limit int) []string {
			got := []string{}
			after := ""
			for pages := 0; ; pages++ {
				require.Less(t, pages, n+1, "too many pages")
				v := url.Values{"limit": {fmt.Sprint(limit)}}
				if query != "" {
					q, err := url.ParseQuery(query)
					require.NoError(t, err)
					for k, vs := range q {
						v[k] = vs
					}
				}
				if after != "" {
					v.Set("after", after)
				}
				p := b.listPage(t, v.Encode())
				require.LessOrEqual(t, len(p.Refunds), limit)
				got = append(got, idsOf(p.Refunds)...)
				if p.Next == nil {
					return got
				}
				require.Len(t, p.Refunds, limit, "a page before the last is full")
				require.Equal(t, p.Refunds[len(p.Refunds)-1].ID, *p.Next)
				after = *p.Next
			}
		}
		since := url.Values{"createdAfter": {all[1].CreatedAt.Format(time.RFC3339Nano)}}.Encode()
		for _, tc := range []struct {
			name  string
			query string
			limit int
			want  []string
		}{
			{"ByTwo", "", 2, ids},
			{"ByOne", "", 1, ids},
			{"AllInOne", "", n, ids},
			{"MoreThanAll", "", 1000, ids},
			{"CreatedAfter", since, 2, ids[2:]},
			{"CreatedAfterInOne", since, 10, ids[2:]},
			{"CreatedAfterTheLast", url.Values{"createdAfter": {all[n-1].CreatedAt.Format(time.RFC3339Nano)}}.Encode(), 2, []string{}},
			{"CreatedAfterLongAgo", "createdAfter=2000-01-01T00:00:00Z", 3, ids},
			{"CreatedAfterWithOffset", url.Values{"createdAfter": {all[1].CreatedAt.In(time.FixedZone("", 2*3600)).Format(time.RFC3339Nano)}}.Encode(), 2, ids[2:]},
		} {
			t.Run(tc.name, func(t *testing.T) {
				require.Equal(t, tc.want, walk(t, tc.query, tc.limit))
			})
		}

		// Without limit: every refund after the one named, in one page.
		p := b.listPage(t, "after="+ids[2])
		require.Equal(t, ids[3:], idsOf(p.Refunds))
		require.Nil(t, p.Next)
		p = b.listPage(t, since)
		require.Equal(t, ids[2:], idsOf(p.Refunds))
		require.Nil(t, p.Next)
		// Empty values are absent ones.
		require.Equal(t, ids, idsOf(b.listPage(t, "after=&createdAfter=").Refunds))
		for _, r := range all {
			require.Equal(t, fakeprovider.StatusSucceeded, r.Status)
			require.Equal(t, 1, r.Requests)
		}

		for _, tc := range []struct{ query, param string }{
			{"limit=0", "limit"},
			{"limit=1001", "limit"},
			{"limit=-1", "limit"},
			{"limit=x", "limit"},
			{"limit=", "limit"},
			{"limit=1.5", "limit"},
			{"after=pr_", "after"},
			{"limit=2&after=pr_nosuchrefund", "after"},
			{"createdAfter=yesterday", "createdAfter"},
			{"createdAfter=2026-13-01T00:00:00Z", "createdAfter"},
			{"createdAfter=2026-01-01", "createdAfter"},
		} {
			a := b.do(t, http.MethodGet, "/refunds?"+tc.query, nil, "")
			require.Equal(t, http.StatusBadRequest, a.status, tc.query)
			require.Equal(t, "invalid_request", a.errorCode(t), tc.query)
			var body struct {
				Error struct {
					Param string `json:"param"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(a.body, &body))
			require.Equal(t, tc.param, body.Error.Param, tc.query)
		}
	})

	t.Run("OldestFirst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := []string{b.refundID(t, "k1", "A-1", 1), b.refundID(t, "k2", "A-2", 2), b.refundID(t, "k3", "A-3", 3)}
		got := b.list(t)
		require.Len(t, got, 3)
		for i := range ids {
			require.Equal(t, ids[i], got[i].ID)
		}
	})
}

func TestFaults(t *testing.T) {
	t.Parallel()

	t.Run("Error", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "error", "count": 2}`)
		for range 2 {
			a := b.refund(t, "key-1", "A-1", 100)
			require.Equal(t, http.StatusServiceUnavailable, a.status)
			require.Equal(t, "service_unavailable", a.errorCode(t))
			require.Empty(t, b.list(t))
		}
		b.refundID(t, "key-1", "A-1", 100)
		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Requests)
	})

	t.Run("CountDefaultsToOne", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "error"}`)
		require.Equal(t, http.StatusServiceUnavailable, b.refund(t, "key-1", "A-1", 100).status)
		b.refundID(t, "key-1", "A-1", 100)
	})

	t.Run("LostResponse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "lost_response", "count": 1}`)
		a := b.refund(t, "key-1", "A-1", 100)
		require.Equal(t, http.StatusServiceUnavailable, a.status)
		require.Equal(t, "service_unavailable", a.errorCode(t))

		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Requests)
		byKey := b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "")
		require.Equal(t, http.StatusOK, byKey.status)

		require.Equal(t, got[0].ID, b.refundID(t, "key-1", "A-1", 100))
		got = b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, 2, got[0].Requests)
	})

	t.Run("Slow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const delay = 50 * time.Millisecond
		b.fault(t, fmt.Sprintf(`{"mode": "slow", "count": 1, "delayMs": %d}`, delay.Milliseconds()))
		start := time.Now()
		b.refundID(t, "key-1", "A-1", 100)
		require.GreaterOrEqual(t, time.Since(start), delay)
		require.Len(t, b.list(t), 1)
	})

	t.Run("SlowGoesOnWhenTheCallerGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "slow", "count": 1, "delayMs": 2000}`)
		// The caller gives up once the provider has its request and is slow
		// with it (it took the fault), not before: on a loaded machine a fixed
		// timeout could end the request before the provider read it.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			for ctx.Err() == nil {
				var left int
				if err := b.pool.QueryRow(ctx, "SELECT remaining FROM provider.fault").Scan(&left); err == nil && left == 0 {
					cancel()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/refunds", strings.NewReader(`{"orderId": "A-1", "amount": 100}`))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "key-1")
		_, err = http.DefaultClient.Do(req)
		require.ErrorIs(t, err, context.Canceled, "the caller gave up during the delay")
		// The provider makes the refund once the delay is over, as a real one that
		// was slow to answer would have.
		require.Eventually(t, func() bool {
			resp, err := http.Get(b.url + "/refunds/by-key/key-1")
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}, 10*time.Second, 10*time.Millisecond)
		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Requests)
		require.Equal(t, got[0].ID, b.refundID(t, "key-1", "A-1", 100))
	})

	t.Run("SlowIsNotTiedToTheRequestContext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "slow", "count": 1, "delayMs": 1000}`)
		// A request whose context has ended before the handler even runs (its
		// caller left, or a server in front of the provider gave up on it):
		// the handler returns without an answer, and the provider carries the
		// request out all the same, once its delay is over.
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/refunds",
			strings.NewReader(`{"orderId": "A-1", "amount": 100, "reference": "re_1"}`))
		req.Header.Set("Idempotency-Key", "key-1")
		rec := httptest.NewRecorder()
		b.srv.Handler().ServeHTTP(rec, req)
		require.Empty(t, rec.Body.String(), "nobody to answer")
		waitUntil(t, "the refund is made", func() bool {
			return b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "").status == http.StatusOK
		})
		got := b.byKey(t, "key-1")
		require.Equal(t, fakeprovider.StatusSucceeded, got.Status)
		require.Equal(t, 1, got.Requests)
		require.Equal(t, got.ID, b.refundID(t, "key-1", "A-1", 100))
	})

	t.Run("LookupError", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		made := b.refundID(t, "key-1", "A-1", 100)
		b.fault(t, `{"mode": "lookup_error", "count": 2}`)
		// Refund POSTs take nothing from it.
		b.refundID(t, "key-2", "A-1", 100)
		for _, key := range []string{"key-1", "key-never"} {
			a := b.do(t, http.MethodGet, "/refunds/by-key/"+key, nil, "")
			require.Equal(t, http.StatusServiceUnavailable, a.status, "body: %s", a.body)
			require.Equal(t, "service_unavailable", a.errorCode(t))
		}
		require.Equal(t, made, b.byKey(t, "key-1").ID)
		require.Equal(t, "refund_not_found", b.do(t, http.MethodGet, "/refunds/by-key/key-never", nil, "").errorCode(t))
		require.Len(t, b.list(t), 2)
	})

	t.Run("LaggingLookup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "lagging_lookup", "count": 1, "delayMs": 600000}`)
		a := b.refund(t, "key-1", "A-1", 100)
		require.Equal(t, http.StatusServiceUnavailable, a.status, "body: %s", a.body)
		require.Equal(t, "service_unavailable", a.errorCode(t))

		// Made, and listed at once; the lookup does not find it yet.
		got := b.list(t)
		require.Len(t, got, 1)
		require.Equal(t, fakeprovider.StatusSucceeded, got[0].Status)
		lookup := b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "")
		require.Equal(t, http.StatusNotFound, lookup.status, "body: %s", lookup.body)
		require.Equal(t, "refund_not_found", lookup.errorCode(t))
		// A repeat answers the refund; the lookup still lags.
		require.Equal(t, got[0].ID, b.refundID(t, "key-1", "A-1", 100))
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "").status)

		// Once its time has come (moved forward rather than waited out), the
		// lookup finds it.
		_, err := b.pool.Exec(t.Context(), "UPDATE provider.refund SET lookup_after = clock_timestamp() WHERE idempotency_key = 'key-1'")
		require.NoError(t, err)
		found := b.byKey(t, "key-1")
		require.Equal(t, got[0].ID, found.ID)
		require.Equal(t, 2, found.Requests)
	})

	t.Run("LaggingLookupSendsTheEventAtOnce", func(t *testing.T) {
		t.Parallel()
		h := newHooks(t)
		b := serveWith(t, migrated(t), h.config())
		b.run(t)
		b.fault(t, `{"mode": "lagging_lookup", "delayMs": 600000}`)
		require.Equal(t, http.StatusServiceUnavailable, b.refund(t, "key-1", "A-1", 100).status)
		id := b.list(t)[0].ID
		ev := h.eventOf(t, id)
		require.Equal(t, fakeprovider.EventRefundSucceeded, ev.Type)
		require.Equal(t, "key-1", ev.Data.IdempotencyKey)
		require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/refunds/by-key/key-1", nil, "").status,
			"the event came while the lookup lags")
	})

	t.Run("LaggingLookupDefaultDelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "lagging_lookup"}`)
		require.Equal(t, http.StatusServiceUnavailable, b.refund(t, "key-1", "A-1", 100).status)
		var lag time.Duration
		require.NoError(t, b.pool.QueryRow(t.Context(),
			"SELECT lookup_after - created_at FROM provider.refund WHERE idempotency_key = 'key-1'").Scan(&lag))
		require.InDelta(t, time.Second, lag, float64(100*time.Millisecond))
	})

	t.Run("DeclineWithLostResponse", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "lost_response"}`)
		require.Equal(t, http.StatusServiceUnavailable, b.refund(t, "key-1", fakeprovider.DeclinePrefix+"1", 100).status)
		require.Equal(t, http.StatusPaymentRequired, b.refund(t, "key-1", fakeprovider.DeclinePrefix+"1", 100).status)
		require.Empty(t, b.list(t))
	})

	t.Run("Clear", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "error", "count": 5}`)
		a := b.do(t, http.MethodDelete, "/faults", nil, "")
		require.Equal(t, http.StatusNoContent, a.status)
		b.refundID(t, "key-1", "A-1", 100)
	})

	t.Run("ReplacesThePendingFault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.fault(t, `{"mode": "error", "count": 5}`)
		b.fault(t, `{"mode": "lost_response", "count": 1}`)
		require.Equal(t, http.StatusServiceUnavailable, b.refund(t, "key-1", "A-1", 100).status)
		require.Len(t, b.list(t), 1)
		b.refundID(t, "key-2", "A-1", 100)
	})

	t.Run("SharedByServersOfOneDatabase", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := &bundle{pool: b.pool, url: serve(t, b.pool)}
		b.fault(t, `{"mode": "error", "count": 1}`)
		require.Equal(t, http.StatusServiceUnavailable, other.refund(t, "key-1", "A-1", 100).status)
		b.refundID(t, "key-1", "A-1", 100)
		require.Len(t, other.list(t), 1)
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, body := range []string{
			`{"mode": "explode"}`,
			`{"count": 1}`,
			`{"mode": "error", "count": -1}`,
			`{"mode": "slow", "delayMs": -1}`,
			`{"mode": "slow", "delayMs": 3600000}`,
			`{"mode": "error", "extra": 1}`,
			`{"mode": "pending", "outcome": "maybe"}`,
			`{"mode": "pending", "outcome": 1}`,
			`{"mode": "pending", "delayMs": 600001}`,
			`{"mode": "lagging_lookup", "delayMs": -1}`,
			`{"mode": "lookup_error", "count": -1}`,
			`[]`,
		} {
			a := b.do(t, http.MethodPost, "/faults", nil, body)
			require.Equal(t, http.StatusBadRequest, a.status, "body %s", body)
			require.Equal(t, "invalid_request", a.errorCode(t), "body %s", body)
		}
		b.refundID(t, "key-1", "A-1", 100)
	})
}

func TestMigrate(t *testing.T) {
	t.Parallel()

	t.Run("ConcurrentAndRepeated", func(t *testing.T) {
		t.Parallel()
		pool := testdb.Pool(t)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() { errs[i] = fakeprovider.Migrate(t.Context(), pool) })
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.NoError(t, fakeprovider.Migrate(t.Context(), pool))
	})
}
