package refund_test

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The provider's words that the tests use: the demo's fake provider
// (cmd/internal/fakeprovider) declines every refund of an order whose id
// starts with declinePrefix, and its refunds' ids start with providerIDPrefix.
const (
	declinePrefix    = "DECLINE-"
	providerIDPrefix = "pr_"
)

// The statuses of a provider's refund.
const (
	providerPending   = "pending"
	providerSucceeded = "succeeded"
	providerFailed    = "failed"
)

// providerAPI serves, from memory, the provider's HTTP API that ProviderClient
// speaks, as the demo's fake provider serves it from its database, with the
// part of its faults that the tests inject (the library imports none of the
// demo's packages, its tests neither):
//
//	POST /refunds               refund an order under an Idempotency-Key: 200
//	                            {"id", "status", "orderId", "amount"}, the refund
//	                            made under the key if there is one (counted as a
//	                            request of it); 402 declined for an order id
//	                            that starts with declinePrefix, nothing made
//	GET  /refunds/by-key/{key}  the refund made under key, or 404 refund_not_found
//	GET  /refunds               {"refunds": [...]}, oldest first
//	POST /faults                {"mode", "count", "delayMs", "outcome"}: the next
//	                            count refund POSTs (1 by default) fail with mode
//
// The faults are the fake provider's: "error" answers 503 and makes nothing;
// "lost_response" makes the refund and answers 503; "slow" carries the request
// out delayMs (1000 by default) after it arrived, whether or not its caller is
// still there; "pending" makes the refund pending, which becomes outcome
// ("succeeded" by default, or "failed") delayMs later. Errors answer
// {"error": {"code", "message"}}. A providerAPI serves for one test: see
// serveProvider.
type providerAPI struct {
	mu      sync.Mutex
	byKey   map[string]*apiRefund
	refunds []*apiRefund // oldest first
	fault   *apiFault
}

// apiRefund is a refund that the providerAPI made, as its lookup shows it.
type apiRefund struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotencyKey"`
	OrderID        string    `json:"orderId"`
	Amount         int64     `json:"amount"`
	Status         string    `json:"status"`
	Requests       int       `json:"requests"`
	CreatedAt      time.Time `json:"createdAt"`

	// A pending refund becomes outcome at settleAt.
	outcome  string
	settleAt time.Time
}

// apiFault is the fault injected into the next count refund POSTs.
type apiFault struct {
	mode    string
	count   int
	delay   time.Duration
	outcome string
}

// serveProvider serves a new providerAPI until the end of the test, and
// returns it with its base URL.
func serveProvider(t *testing.T) (*providerAPI, string) {
	t.Helper()
	p := &providerAPI{byKey: map[string]*apiRefund{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /refunds", p.createRefund)
	mux.HandleFunc("GET /refunds/by-key/{key}", p.getRefundByKey)
	mux.HandleFunc("GET /refunds", p.listRefunds)
	mux.HandleFunc("POST /faults", p.setFault)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return p, ts.URL
}

func (p *providerAPI) createRefund(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeProviderError(w, http.StatusBadRequest, "idempotency_key_missing", "the Idempotency-Key header is required")
		return
	}
	var req struct {
		OrderID string `json:"orderId"`
		Amount  int64  `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.OrderID == "" || req.Amount <= 0 {
		writeProviderError(w, http.StatusBadRequest, "invalid_request", "the body must be {\"orderId\", \"amount\"}, with a positive amount")
		return
	}

	fault := p.takeFault()
	if fault.mode == "slow" {
		// Carried out all the same when the caller has given up meanwhile.
		time.Sleep(time.Until(arrived.Add(fault.delay)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case fault.mode == "error":
		writeProviderError(w, http.StatusServiceUnavailable, "service_unavailable", "the provider is unavailable (injected fault)")
		return
	case strings.HasPrefix(req.OrderID, declinePrefix):
		if fault.mode == "lost_response" {
			writeProviderError(w, http.StatusServiceUnavailable, "service_unavailable", "the provider is unavailable (injected fault)")
			return
		}
		writeProviderError(w, http.StatusPaymentRequired, "declined", fmt.Sprintf("the refund of order %s was declined", req.OrderID))
		return
	}
	ref := p.byKey[key]
	if ref == nil {
		ref = &apiRefund{
			ID: providerIDPrefix + rand.Text(), IdempotencyKey: key, OrderID: req.OrderID, Amount: req.Amount,
			Status: providerSucceeded, CreatedAt: time.Now().UTC(),
		}
		if fault.mode == "pending" {
			ref.Status, ref.outcome, ref.settleAt = providerPending, fault.outcome, arrived.Add(fault.delay)
		}
		p.byKey[key] = ref
		p.refunds = append(p.refunds, ref)
	}
	ref.Requests++
	if fault.mode == "lost_response" {
		writeProviderError(w, http.StatusServiceUnavailable, "service_unavailable", "the provider is unavailable (injected fault)")
		return
	}
	if ref.Requests > 1 {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	now := ref.now()
	writeProviderJSON(w, http.StatusOK, map[string]any{"id": now.ID, "status": now.Status, "orderId": now.OrderID, "amount": now.Amount})
}

// takeFault takes one injection of the fault, or returns the zero apiFault
// when there is none.
func (p *providerAPI) takeFault() apiFault {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fault == nil {
		return apiFault{}
	}
	f := *p.fault
	if p.fault.count--; p.fault.count == 0 {
		p.fault = nil
	}
	return f
}

// now returns the refund as it is now: a pending refund whose time has come
// has become its outcome. The caller holds the providerAPI's mu.
func (r *apiRefund) now() apiRefund {
	if r.Status == providerPending && !time.Now().Before(r.settleAt) {
		r.Status = r.outcome
	}
	return *r
}

func (p *providerAPI) getRefundByKey(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ref := p.byKey[r.PathValue("key")]
	if ref == nil {
		writeProviderError(w, http.StatusNotFound, "refund_not_found", "no refund was made under this idempotency key")
		return
	}
	writeProviderJSON(w, http.StatusOK, ref.now())
}

func (p *providerAPI) listRefunds(w http.ResponseWriter, _ *http.Request) {
	writeProviderJSON(w, http.StatusOK, map[string]any{"refunds": p.list(), "next": nil})
}

// list returns the refunds made, oldest first, as they are now.
func (p *providerAPI) list() []apiRefund {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := make([]apiRefund, len(p.refunds))
	for i, r := range p.refunds {
		list[i] = r.now()
	}
	return list
}

func (p *providerAPI) setFault(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Mode    string  `json:"mode"`
		Count   *int    `json:"count"`
		DelayMs *int    `json:"delayMs"`
		Outcome *string `json:"outcome"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeProviderError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	f := &apiFault{mode: req.Mode, count: 1, delay: time.Second, outcome: providerSucceeded}
	if req.Count != nil {
		f.count = *req.Count
	}
	if req.DelayMs != nil {
		f.delay = time.Duration(*req.DelayMs) * time.Millisecond
	}
	if req.Outcome != nil {
		f.outcome = *req.Outcome
	}
	switch {
	case f.mode != "error" && f.mode != "lost_response" && f.mode != "slow" && f.mode != "pending":
		writeProviderError(w, http.StatusBadRequest, "invalid_request", "mode is none of error, lost_response, slow and pending")
		return
	case f.count < 1, f.delay < 0, f.outcome != providerSucceeded && f.outcome != providerFailed:
		writeProviderError(w, http.StatusBadRequest, "invalid_request", "count must be positive, delayMs not negative, outcome succeeded or failed")
		return
	}
	p.mu.Lock()
	p.fault = f
	p.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func writeProviderError(w http.ResponseWriter, status int, code, message string) {
	writeProviderJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": message}})
}

func writeProviderJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
