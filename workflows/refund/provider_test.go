package refund_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// setupProvider serves a provider (providerAPI) and returns a client of it.
func setupProvider(t *testing.T) *refund.ProviderClient {
	t.Helper()
	_, url := serveProvider(t)
	return &refund.ProviderClient{BaseURL: url + "/"}
}

func TestProviderClient(t *testing.T) {
	t.Parallel()

	t.Run("RefundAndByKey", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		_, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.False(t, found)

		ref, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.NotEmpty(t, ref.ID)
		again, err := c.Refund(t.Context(), "key/1", refund.ProviderRequest{OrderID: "A-1", Amount: 100, Reference: "re_1"})
		require.NoError(t, err)
		require.Equal(t, ref.ID, again.ID)

		got, found, err := c.ByKey(t.Context(), "key/1")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, &refund.ProviderRefund{ID: ref.ID, OrderID: "A-1", Amount: 100, Status: "succeeded"}, got)
	})

	t.Run("DeclineMatchesErrProviderDeclined", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: declinePrefix + "1", Amount: 100})
		require.ErrorIs(t, err, refund.ErrProviderDeclined)
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusPaymentRequired, pe.StatusCode)
		require.EqualValues(t, "declined", pe.Code)
	})

	t.Run("ErrorAnswersAreNotDeclines", func(t *testing.T) {
		t.Parallel()
		c := setupProvider(t)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, c.BaseURL+"faults", strings.NewReader(`{"mode": "error"}`))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusNoContent, resp.StatusCode)

		_, err = c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusServiceUnavailable, pe.StatusCode)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))

		_, err = c.Refund(t.Context(), "", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadRequest, pe.StatusCode)
		require.EqualValues(t, "idempotency_key_missing", pe.Code)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))
	})

	t.Run("UnreachableIsNotADecline", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.NotFoundHandler())
		ts.Close()
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		require.Error(t, err)
		require.False(t, errors.Is(err, refund.ErrProviderDeclined))
		_, _, err = c.ByKey(t.Context(), "key-1")
		require.Error(t, err)
	})

	// A 404 that is not the provider's own "no refund under this key" (a wrong
	// base URL, a proxy's page) is an error, never "not made": a lookup that
	// took it for one would let the ledger move be undone although the
	// provider refunded.
	t.Run("NotFoundFromSomethingElseIsNoAnswer", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(ts.Close)
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, found, err := c.ByKey(t.Context(), "key-1")
		require.Error(t, err)
		require.False(t, found)
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusNotFound, pe.StatusCode)
	})

	t.Run("NonJSONErrorAnswer", func(t *testing.T) {
		t.Parallel()
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}))
		t.Cleanup(ts.Close)
		c := &refund.ProviderClient{BaseURL: ts.URL}
		_, err := c.Refund(t.Context(), "key-1", refund.ProviderRequest{OrderID: "A-1", Amount: 100})
		var pe *refund.ProviderError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, http.StatusBadGateway, pe.StatusCode)
		require.Equal(t, "bad gateway", pe.Message)
	})
}

// setupWithProvider is setup with the refund operation's provider step calling
// p instead of a providerAPI, and retry as the steps' retry policy.
func setupWithProvider(t *testing.T, p refund.Provider, retry engine.RetryPolicy) *bundle {
	t.Helper()
	ctx := t.Context()
	pool := testdb.Pool(t)
	require.NoError(t, refund.Migrate(ctx, pool))
	wf, err := refund.New(p, &refund.Config{Retry: retry})
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{
		Operations:    wf.Operations(),
		SweepInterval: 50 * time.Millisecond,
		PollInterval:  20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Stop(stopCtx))
	})
	return &bundle{pool: pool, e: e, wf: wf}
}

// stubProvider is a provider whose answers a test scripts: each refund POST
// is answered by post with the request's number (from 1), key and body, and
// each GET /refunds/by-key/{key} by get with the key.
type stubProvider struct {
	post func(n int, key string, req refund.ProviderRequest) (status int, body string)
	get  func(key string) (status int, body string)

	mu          sync.Mutex
	posts, gets int
	keys        []string
}

func (p *stubProvider) serve(t *testing.T) *refund.ProviderClient {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /refunds", func(w http.ResponseWriter, r *http.Request) {
		var req refund.ProviderRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("stub provider: decode the refund request: %s", err)
		}
		p.mu.Lock()
		p.posts++
		n := p.posts
		p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
		p.mu.Unlock()
		status, body := p.post(n, r.Header.Get("Idempotency-Key"), req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	mux.HandleFunc("GET /refunds/by-key/{key}", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.gets++
		p.mu.Unlock()
		status, body := p.get(r.PathValue("key"))
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return &refund.ProviderClient{BaseURL: ts.URL}
}

func (p *stubProvider) counts() (posts, gets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posts, p.gets
}

// refundJSON is the provider's answer for a refund made.
func refundJSON(id, orderID string, amount int64) string {
	return fmt.Sprintf(`{"id": %q, "status": "succeeded", "orderId": %q, "amount": %d}`, id, orderID, amount)
}

const (
	unavailableJSON = `{"error": {"code": "service_unavailable", "message": "the provider is unavailable"}}`
	notMadeJSON     = `{"error": {"code": "refund_not_found", "message": "no refund was made under this idempotency key"}}`
)

// requireParked requires that the refund stopped, needing attention with
// code, its ledger move neither finished nor undone.
func (b *bundle) requireParked(t *testing.T, info *engine.Info, code string) {
	t.Helper()
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.True(t, info.Parked)
	require.NotNil(t, info.Attention)
	require.EqualValues(t, code, info.Attention.Code)
	steps := b.stepsOf(t, info)
	require.Equal(t, engine.StepStatusSucceeded, steps[refund.StepLedger].Status, "not undone on a guess")
	require.NotEqual(t, engine.StepStatusSucceeded, steps[refund.StepProvider].Status)
	require.Equal(t, engine.StepStatusNotStarted, steps[refund.StepFinalize].Status)
	require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
	o := b.getOrder(t, "merchant-a", "A-1")
	require.Len(t, o.Refunds, 1)
	require.Equal(t, refund.StatusPending, o.Refunds[0].Status)
	require.Nil(t, o.Refunds[0].ProviderRefundID, "the other refund is not recorded as this one's")
}

// TestProviderStep drives the refund's provider step, an httpstep call, with a
// provider whose answers the test scripts.
func TestProviderStep(t *testing.T) {
	t.Parallel()
	fast := engine.RetryPolicy{Base: 10 * time.Millisecond}

	t.Run("RequestUnderTheDerivedKey", func(t *testing.T) {
		t.Parallel()
		var asked refund.ProviderRequest
		p := &stubProvider{post: func(_ int, _ string, req refund.ProviderRequest) (int, string) {
			asked = req
			return http.StatusOK, refundJSON("pr_1", req.OrderID, req.Amount)
		}}
		b := setupWithProvider(t, p.serve(t), fast)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		out, err := b.wf.Refund.Result(info)
		require.NoError(t, err)
		require.Equal(t, "pr_1", *out.ProviderRefundID)
		require.Equal(t, refund.ProviderRequest{OrderID: "A-1", Amount: 1000, Reference: out.RefundID}, asked)
		p.mu.Lock()
		defer p.mu.Unlock()
		require.Equal(t, []string{b.stepsOf(t, info)[refund.StepProvider].DerivedKey}, p.keys)
	})

	// A refund the provider made under the derived key for another amount, or
	// another order, is no success: the operation stops, needing attention.
	t.Run("MismatchHalts", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			// answer is the refund the provider says it made for the one asked.
			answer func(req refund.ProviderRequest) string
			// lost: the POST's answer is lost, and the lookup finds the refund.
			lost bool
		}{
			{name: "AmountInTheAnswer", answer: func(req refund.ProviderRequest) string { return refundJSON("pr_1", req.OrderID, req.Amount+1) }},
			{name: "OrderInTheAnswer", answer: func(req refund.ProviderRequest) string { return refundJSON("pr_1", req.OrderID+"-other", req.Amount) }},
			{name: "AmountFoundByTheLookup", lost: true, answer: func(req refund.ProviderRequest) string { return refundJSON("pr_1", req.OrderID, req.Amount+1) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				var mu sync.Mutex
				made := map[string]string{}
				p := &stubProvider{
					post: func(_ int, key string, req refund.ProviderRequest) (int, string) {
						mu.Lock()
						defer mu.Unlock()
						made[key] = tc.answer(req)
						if tc.lost {
							return http.StatusServiceUnavailable, unavailableJSON
						}
						return http.StatusOK, made[key]
					},
					get: func(key string) (int, string) {
						mu.Lock()
						defer mu.Unlock()
						if made[key] == "" {
							return http.StatusNotFound, notMadeJSON
						}
						return http.StatusOK, made[key]
					},
				}
				b := setupWithProvider(t, p.serve(t), fast)
				b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
				info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
				b.requireParked(t, info, refund.CodeProviderMismatch)
				posts, _ := p.counts()
				require.Equal(t, 1, posts, "never asked again")
			})
		}
	})

	// A 404 of the lookup that is not the provider's refund_not_found (a wrong
	// URL, a proxy's page) says nothing about the refund: it is never "not
	// made", so the refund is neither asked again nor undone.
	t.Run("NotFoundFromElsewhereIsNoAnswer", func(t *testing.T) {
		t.Parallel()
		p := &stubProvider{
			post: func(int, string, refund.ProviderRequest) (int, string) {
				return http.StatusServiceUnavailable, unavailableJSON // made, or not: nobody can tell
			},
			get: func(string) (int, string) { return http.StatusNotFound, "404 page not found\n" },
		}
		b := setupWithProvider(t, p.serve(t), engine.RetryPolicy{Base: 10 * time.Millisecond, MaxAttempts: 3, Cap: time.Hour})
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		s, err := engine.Start(t.Context(), b.e, b.wf.Refund, "merchant-a", "key-1",
			refund.RefundInput{Client: "merchant-a", OrderID: "A-1", Amount: 1000}, nil)
		require.NoError(t, err)
		// Out of attempts, the step asks the lookup, which cannot tell: the
		// step waits for its outcome (it needs attention only past its settle
		// window), asking again, and calls no more.
		var info *engine.Info
		require.Eventually(t, func() bool {
			got, err := b.e.Get(t.Context(), s.ID)
			if err != nil || got.Steps[1].Status != engine.StepStatusWaiting {
				return false
			}
			_, gets := p.counts()
			info = got
			return gets >= 4
		}, 30*time.Second, 20*time.Millisecond)
		require.Nil(t, info.Attention, "within its outcome window")
		require.Equal(t, engine.StatusInProgress, info.Status)
		posts, _ := p.counts()
		require.Equal(t, 1, posts, "the lookup's error is no \"not made\": the refund was not asked again")
		steps := b.stepsOf(t, info)
		require.Equal(t, engine.StepStatusSucceeded, steps[refund.StepLedger].Status, "not undone")
		require.Contains(t, steps[refund.StepProvider].LastCause, "404")
		require.Equal(t, map[string]int64{"customer:cus_1": -4000, "merchant": 4000}, b.balances(t, "merchant-a"))
	})

	// Only a decline fails the refund; any other error answer, a refusal too,
	// is retried with the same key, after the lookup found nothing.
	t.Run("RefusalIsRetried", func(t *testing.T) {
		t.Parallel()
		p := &stubProvider{
			post: func(n int, _ string, req refund.ProviderRequest) (int, string) {
				if n == 1 {
					return http.StatusBadRequest, `{"error": {"code": "invalid_request", "message": "try again"}}`
				}
				return http.StatusOK, refundJSON("pr_1", req.OrderID, req.Amount)
			},
			get: func(string) (int, string) { return http.StatusNotFound, notMadeJSON },
		}
		b := setupWithProvider(t, p.serve(t), fast)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		require.Equal(t, 2, b.stepsOf(t, info)[refund.StepProvider].Attempts)
		posts, gets := p.counts()
		require.Equal(t, 2, posts)
		require.Equal(t, 1, gets)
		p.mu.Lock()
		defer p.mu.Unlock()
		require.Equal(t, p.keys[0], p.keys[1], "the same key")
	})

	t.Run("DeclineFails", func(t *testing.T) {
		t.Parallel()
		p := &stubProvider{post: func(int, string, refund.ProviderRequest) (int, string) {
			return http.StatusPaymentRequired, `{"error": {"code": "declined", "message": "the refund of order A-1 was declined"}}`
		}}
		b := setupWithProvider(t, p.serve(t), fast)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		requireFailed(t, info, refund.CodeProviderDeclined, refund.StepProvider)
		require.Equal(t, "the payment provider declined the refund", info.Error.Message)
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
	})
}

// memProvider is a Provider that is not a ProviderClient, as a test's fake
// is: refunds in memory, one per key, with an answer to lose and a decline.
type memProvider struct {
	mu    sync.Mutex
	byKey map[string]*refund.ProviderRefund
	lose  int // the next refunds whose answers are lost
	// amountDelta is added to the amount of every refund made: a refund made
	// under the key for another request.
	amountDelta int64
	calls       int
	lookups     int
}

func (p *memProvider) Refund(_ context.Context, key string, req refund.ProviderRequest) (*refund.ProviderRefund, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if strings.HasPrefix(req.OrderID, declinePrefix) {
		return nil, fmt.Errorf("declined: %w", refund.ErrProviderDeclined)
	}
	ref := p.byKey[key]
	if ref == nil {
		ref = &refund.ProviderRefund{ID: fmt.Sprintf("mem_%d", len(p.byKey)+1), OrderID: req.OrderID, Amount: req.Amount + p.amountDelta}
		p.byKey[key] = ref
	}
	if p.lose > 0 {
		p.lose--
		return nil, errors.New("connection reset")
	}
	return ref, nil
}

func (p *memProvider) ByKey(_ context.Context, key string) (*refund.ProviderRefund, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lookups++
	ref := p.byKey[key]
	return ref, ref != nil, nil
}

// TestOtherProvider runs the refund against a Provider that is not a
// ProviderClient: the step calls it through its methods, with the same rules.
func TestOtherProvider(t *testing.T) {
	t.Parallel()
	fast := engine.RetryPolicy{Base: 10 * time.Millisecond}

	t.Run("LostAnswerIsFoundByKey", func(t *testing.T) {
		t.Parallel()
		p := &memProvider{byKey: map[string]*refund.ProviderRefund{}, lose: 1}
		b := setupWithProvider(t, p, fast)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		info := b.refund(t, "merchant-a", "key-1", "A-1", 1000)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		out, err := b.wf.Refund.Result(info)
		require.NoError(t, err)
		require.Equal(t, "mem_1", *out.ProviderRefundID)
		require.Equal(t, engine.ResolvedByLookup, b.stepsOf(t, info)[refund.StepProvider].ResolvedBy)
		require.Equal(t, 1, p.calls)
		require.Equal(t, 1, p.lookups)
	})

	t.Run("Decline", func(t *testing.T) {
		t.Parallel()
		b := setupWithProvider(t, &memProvider{byKey: map[string]*refund.ProviderRefund{}}, fast)
		orderID := declinePrefix + "1"
		b.mustOrder(t, "merchant-a", orderID, "cus_1", 5000)
		requireFailed(t, b.refund(t, "merchant-a", "key-1", orderID, 1000), refund.CodeProviderDeclined, refund.StepProvider)
		require.Equal(t, map[string]int64{"customer:cus_1": -5000, "merchant": 5000}, b.balances(t, "merchant-a"))
	})

	t.Run("MismatchHalts", func(t *testing.T) {
		t.Parallel()
		p := &memProvider{byKey: map[string]*refund.ProviderRefund{}, amountDelta: 1}
		b := setupWithProvider(t, p, fast)
		b.mustOrder(t, "merchant-a", "A-1", "cus_1", 5000)
		b.requireParked(t, b.refund(t, "merchant-a", "key-1", "A-1", 1000), refund.CodeProviderMismatch)
		require.Equal(t, 1, p.calls)
	})
}
