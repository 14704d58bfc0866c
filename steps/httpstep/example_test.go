package httpstep_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// A payment step on a provider with Stripe's conventions. The provider's first
// answer is lost (it pays, then answers 503): the retry asks the lookup by the
// derived key, finds the payment, and does not pay again.
func ExampleStep() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_httpstep")
	defer cleanup()

	// The provider: POST /payments pays once per Idempotency-Key; GET
	// /payments/by-key/{key} shows the payment made under a key.
	var mu sync.Mutex
	paid := map[string]string{} // key: payment id
	posts := 0
	answer := func(w http.ResponseWriter, status int, body any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}
	type errorBody struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		posts++
		key := r.Header.Get("Idempotency-Key")
		if paid[key] == "" {
			paid[key] = fmt.Sprintf("pay_%d", len(paid)+1)
		}
		if posts == 1 {
			answer(w, http.StatusServiceUnavailable, map[string]errorBody{"error": {"unavailable", "try again"}})
			return
		}
		answer(w, http.StatusOK, map[string]string{"id": paid[key]})
	})
	mux.HandleFunc("GET /payments/by-key/{key}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id := paid[r.PathValue("key")]
		if id == "" {
			answer(w, http.StatusNotFound, map[string]errorBody{"error": {"payment_not_found", "no payment under this key"}})
			return
		}
		answer(w, http.StatusOK, map[string]string{"id": id})
	})
	provider := httptest.NewServer(mux)
	defer provider.Close()

	type payIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	type payState struct {
		PaymentID string `json:"paymentId"`
	}
	pay := httpstep.Step("pay", httpstep.Call[payIn, payState]{
		RequestFunc: func(ctx context.Context, at engine.Attempt, in payIn, s *payState) (httpstep.Request, error) {
			return httpstep.Request{URL: provider.URL + "/payments", Body: in}, nil
		},
		DecodeFunc: func(at engine.Attempt, in payIn, s *payState, a httpstep.Answer) error {
			var p struct {
				ID string `json:"id"`
			}
			err := json.Unmarshal(a.Body, &p)
			s.PaymentID = p.ID
			return err
		},
		Lookup: &httpstep.Lookup[payIn, payState]{
			URLFunc: func(at engine.Attempt, in payIn, s *payState) string {
				return provider.URL + "/payments/by-key/" + url.PathEscape(at.Key)
			},
			NotFoundFunc: httpstep.HasCode("payment_not_found"),
		},
	}).Retries(engine.RetryPolicy{Base: 10 * time.Millisecond})

	op, err := engine.NewOperation("payout", []engine.Step[payIn, payState]{pay},
		func(in payIn, s *payState) (string, error) { return s.PaymentID, nil }, nil)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, op, "client-1", "payout-1", payIn{Owner: "ann", Amount: 30}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := started.Wait(ctx); err != nil {
		panic(err)
	}
	info, err := e.Get(ctx, started.ID)
	if err != nil {
		panic(err)
	}
	paymentID, err := op.Result(info)
	if err != nil {
		panic(err)
	}
	step := info.Steps[0]
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("%s: payment %s, %d attempts, resolved by %s\n", info.Status, paymentID, step.Attempts, step.ResolvedBy)
	fmt.Printf("provider: %d payment, %d POST\n", len(paid), posts)
	// Output:
	// succeeded: payment pay_1, 2 attempts, resolved by lookup
	// provider: 1 payment, 1 POST
}
