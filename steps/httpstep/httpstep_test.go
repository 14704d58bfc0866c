package httpstep_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// payIn and payState are the input and state of the tests' operation: one
// payment of Amount for OrderID.
type payIn struct {
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
}

type payState struct {
	Payment payment `json:"payment"`
}

// payment is a payment as the tests' service answers it.
type payment struct {
	ID      string `json:"id"`
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
}

// fault is what the service does instead of answering the next payment POST.
type fault struct {
	// status and body are answered instead of the payment.
	status int
	body   string
	// lost makes the payment first, then answers status: the answer is lost.
	lost bool
	// amountDelta changes the amount of the payment made (and answered) from
	// the one asked: a payment made under the key for another request.
	amountDelta int64
}

// payments is a payment service as Stripe's style has it: POST /payments
// under an Idempotency-Key pays once per key and answers the payment made under
// it; GET /payments/by-key/{key} shows that payment, or answers 404
// payment_not_found. Faults change the answers of the next POSTs.
type payments struct {
	srv *httptest.Server

	mu     sync.Mutex
	byKey  map[string]payment
	faults []fault
	posts  []*http.Request
	gets   []*http.Request
	bodies []string
}

func newPayments(t *testing.T) *payments {
	t.Helper()
	p := &payments{byKey: map[string]payment{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments", p.pay)
	mux.HandleFunc("GET /payments/by-key/{key}", p.find)
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *payments) fault(f ...fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f...)
}

func (p *payments) pay(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.posts = append(p.posts, r)
	p.bodies = append(p.bodies, string(body))
	var f fault
	if len(p.faults) > 0 {
		f, p.faults = p.faults[0], p.faults[1:]
	}
	if f.status != 0 && !f.lost {
		writeJSON(w, f.status, f.body)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	pay, ok := p.byKey[key]
	if !ok {
		var in payIn
		if err := json.Unmarshal(body, &in); err != nil || key == "" {
			writeJSON(w, http.StatusBadRequest, `{"error": {"code": "invalid_request", "message": "bad request"}}`)
			return
		}
		pay = payment{ID: fmt.Sprintf("pay_%d", len(p.byKey)+1), OrderID: in.OrderID, Amount: in.Amount + f.amountDelta}
		p.byKey[key] = pay
	}
	if f.lost {
		writeJSON(w, f.status, f.body)
		return
	}
	raw, _ := json.Marshal(pay)
	writeJSON(w, http.StatusOK, string(raw))
}

func (p *payments) find(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gets = append(p.gets, r)
	pay, ok := p.byKey[r.PathValue("key")]
	if !ok {
		writeJSON(w, http.StatusNotFound, `{"error": {"code": "payment_not_found", "message": "no payment under this key"}}`)
		return
	}
	raw, _ := json.Marshal(pay)
	writeJSON(w, http.StatusOK, string(raw))
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// counts returns how many POSTs and GETs the service got.
func (p *payments) counts() (posts, gets int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.posts), len(p.gets)
}

// requests returns the POSTs and GETs the service got, and the POSTs' bodies.
func (p *payments) requests() (posts, gets []*http.Request, bodies []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.posts...), append([]*http.Request(nil), p.gets...), append([]string(nil), p.bodies...)
}

// made returns the payments made.
func (p *payments) made() map[string]payment {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]payment, len(p.byKey))
	for k, v := range p.byKey {
		out[k] = v
	}
	return out
}

// call is the tests' call of the payment service: a payment POST, its answer
// decoded into the state and checked against the input, and a lookup by key.
func (p *payments) call() httpstep.Call[payIn, payState] {
	return httpstep.Call[payIn, payState]{
		Header: http.Header{"Authorization": {"Bearer test-token"}},
		RequestFunc: func(_ context.Context, _ engine.Attempt, in payIn, _ *payState) (httpstep.Request, error) {
			return httpstep.Request{URL: p.srv.URL + "/payments", Body: in}, nil
		},
		DecodeFunc: func(_ engine.Attempt, _ payIn, s *payState, a httpstep.Answer) error {
			return json.Unmarshal(a.Body, &s.Payment)
		},
		CheckFunc: func(in payIn, s *payState) error {
			if s.Payment.OrderID != in.OrderID || s.Payment.Amount != in.Amount {
				return engine.Halt("payment_mismatch", fmt.Sprintf("payment %s is for order %s, amount %d", s.Payment.ID, s.Payment.OrderID, s.Payment.Amount))
			}
			return nil
		},
		Lookup: &httpstep.Lookup[payIn, payState]{
			URLFunc: func(at engine.Attempt, _ payIn, _ *payState) string {
				return p.srv.URL + "/payments/by-key/" + url.PathEscape(at.Key)
			},
			NotFoundFunc: httpstep.HasCode("payment_not_found"),
		},
	}
}

// bundle is what setup hands a test: an engine with the operation "pay" of one
// step "pay", the call of a payment service, on a database of its own.
type bundle struct {
	e  *engine.Engine
	op *engine.Operation[payIn, payState, payment]
	p  *payments
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := t.Context()
	p := newPayments(t)
	op, err := engine.NewOperation("pay", []engine.Step[payIn, payState]{
		httpstep.Step("pay", p.call()).Retries(engine.RetryPolicy{Base: 10 * time.Millisecond, MaxAttempts: 5}),
	}, func(_ payIn, s *payState) (payment, error) { return s.Payment, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(testdb.Pool(t), &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Stop(stopCtx))
	})
	return &bundle{e: e, op: op, p: p}
}

// pay runs the operation under key and waits for it to finish or be parked; it
// returns the operation with its steps.
func (b *bundle) pay(t *testing.T, key string, in payIn) *engine.Info {
	t.Helper()
	s, err := engine.Start(t.Context(), b.e, b.op, "client-1", key, in, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = s.Wait(ctx)
	require.NoError(t, err)
	info, err := b.e.Get(t.Context(), s.ID)
	require.NoError(t, err)
	require.Len(t, info.Steps, 1)
	return info
}

func TestStep(t *testing.T) {
	t.Parallel()

	t.Run("Succeeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		info := b.pay(t, "key-1", payIn{OrderID: "A-1", Amount: 1500})
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		out, err := b.op.Result(info)
		require.NoError(t, err)
		require.Equal(t, payment{ID: "pay_1", OrderID: "A-1", Amount: 1500}, out)

		step := info.Steps[0]
		require.Equal(t, 1, step.Attempts)
		require.Equal(t, engine.ResolvedByCall, step.ResolvedBy)
		posts, gets := b.p.counts()
		require.Equal(t, 1, posts)
		require.Zero(t, gets, "a first attempt does not look up")
		reqs, _, bodies := b.p.requests()
		req := reqs[0]
		require.Equal(t, step.DerivedKey, req.Header.Get("Idempotency-Key"))
		require.True(t, strings.HasPrefix(step.DerivedKey, "idf3_"), step.DerivedKey)
		require.Equal(t, "application/json", req.Header.Get("Content-Type"))
		require.Equal(t, "Bearer test-token", req.Header.Get("Authorization"))
		require.JSONEq(t, `{"orderId": "A-1", "amount": 1500}`, bodies[0])
	})

	t.Run("RefusalFailsWithTheBodysCode", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.p.fault(fault{status: http.StatusPaymentRequired, body: `{"error": {"code": "card_declined", "message": "the card was declined"}}`})
		info := b.pay(t, "key-1", payIn{OrderID: "A-1", Amount: 1500})
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "card_declined", info.Error.Code)
		require.Equal(t, "the card was declined", info.Error.Message)
		require.Equal(t, "pay", info.Error.Step)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, engine.StepStatusFailed, info.Steps[0].Status)
		require.Equal(t, 1, info.Steps[0].Attempts, "a refusal is not retried")
		posts, gets := b.p.counts()
		require.Equal(t, 1, posts)
		require.Zero(t, gets)
		require.Empty(t, b.p.made())
	})

	t.Run("UnavailableIsRetriedAfterAskingTheLookup", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unavailable := fault{status: http.StatusServiceUnavailable, body: `{"error": {"code": "unavailable", "message": "try later"}}`}
		b.p.fault(unavailable, unavailable)
		info := b.pay(t, "key-1", payIn{OrderID: "A-1", Amount: 1500})
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		require.Equal(t, 3, info.Steps[0].Attempts)
		require.Equal(t, engine.ResolvedByCall, info.Steps[0].ResolvedBy)
		posts, gets := b.p.counts()
		require.Equal(t, 3, posts)
		require.Equal(t, 2, gets, "each retry asked the lookup, which found no payment, so it called")
		postReqs, getReqs, _ := b.p.requests()
		for _, req := range append(postReqs, getReqs...) {
			require.Equal(t, info.Steps[0].DerivedKey, req.Header.Get("Idempotency-Key"), "%s %s", req.Method, req.URL)
			require.Equal(t, "Bearer test-token", req.Header.Get("Authorization"))
		}
		require.Len(t, b.p.made(), 1)
	})

	t.Run("LostAnswerIsFoundByKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.p.fault(fault{lost: true, status: http.StatusBadGateway, body: "bad gateway"})
		info := b.pay(t, "key-1", payIn{OrderID: "A-1", Amount: 1500})
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %v", info.Error)
		out, err := b.op.Result(info)
		require.NoError(t, err)
		require.Equal(t, payment{ID: "pay_1", OrderID: "A-1", Amount: 1500}, out)
		require.Equal(t, 2, info.Steps[0].Attempts)
		require.Equal(t, engine.ResolvedByLookup, info.Steps[0].ResolvedBy)
		posts, gets := b.p.counts()
		require.Equal(t, 1, posts, "found by key: not called again")
		require.Equal(t, 1, gets)
	})

	// A payment under the derived key for another amount is no success, and
	// nothing is undone on it: the operation waits for an operator.
	t.Run("MismatchParks", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name        string
			fault       fault
			posts, gets int
			attempts    int
		}{
			{name: "FoundByTheLookup", fault: fault{lost: true, status: http.StatusServiceUnavailable, amountDelta: 1}, posts: 1, gets: 1, attempts: 2},
			{name: "AnsweredByTheCall", fault: fault{amountDelta: 1}, posts: 1, gets: 0, attempts: 1},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				b.p.fault(tc.fault)
				info := b.pay(t, "key-1", payIn{OrderID: "A-1", Amount: 1500})
				require.Equal(t, engine.StatusInProgress, info.Status)
				require.True(t, info.Parked)
				require.NotNil(t, info.Attention)
				require.EqualValues(t, "payment_mismatch", info.Attention.Code)
				require.Contains(t, info.Attention.Reason, "amount 1501")
				require.NotEqual(t, engine.StepStatusSucceeded, info.Steps[0].Status)
				require.Equal(t, tc.attempts, info.Steps[0].Attempts)
				posts, gets := b.p.counts()
				require.Equal(t, tc.posts, posts, "never called again")
				require.Equal(t, tc.gets, gets)
			})
		}
	})
}

// recorder records the requests a handler gets, with their bodies.
type recorder struct {
	mu     sync.Mutex
	reqs   []*http.Request
	bodies []string
}

func (rec *recorder) record(r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.reqs = append(rec.reqs, r)
	rec.bodies = append(rec.bodies, string(raw))
}

// last returns the last request and its body; it fails t when there was none.
func (rec *recorder) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.reqs, "no request")
	return rec.reqs[len(rec.reqs)-1], rec.bodies[len(rec.bodies)-1]
}

// count returns how many requests of method it got.
func (rec *recorder) count(method string) int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, r := range rec.reqs {
		if r.Method == method {
			n++
		}
	}
	return n
}

// TestRun calls Call.Run, the step's function, directly.
func TestRun(t *testing.T) {
	t.Parallel()

	// serve serves h and returns its URL.
	serve := func(t *testing.T, h http.HandlerFunc) string {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	post := func(u string) func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
		return func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
			return httpstep.Request{URL: u, Body: map[string]int{"n": 1}}, nil
		}
	}
	at := engine.Attempt{Key: "idf2_test"}

	t.Run("Request", func(t *testing.T) {
		t.Parallel()
		var rec recorder
		u := serve(t, func(w http.ResponseWriter, r *http.Request) {
			rec.record(r)
			writeJSON(w, http.StatusCreated, `{}`)
		})
		c := httpstep.Call[payIn, payState]{
			KeyHeader: "X-Request-Key",
			Header:    http.Header{"Authorization": {"Bearer t"}, "X-Both": {"call"}},
			RequestFunc: func(_ context.Context, at engine.Attempt, in payIn, _ *payState) (httpstep.Request, error) {
				return httpstep.Request{
					Method: http.MethodPut,
					URL:    u + "/payments/" + in.OrderID,
					Body:   in,
					// The key header is the derived key's, whatever the request says.
					Header: http.Header{"x-both": {"request"}, "X-Request-Key": {"other"}, "Content-Type": {"application/vnd.pay+json"}},
				}, nil
			},
		}
		require.NoError(t, c.Run(t.Context(), at, payIn{OrderID: "A-1", Amount: 7}, &payState{}))
		got, body := rec.last(t)
		require.Equal(t, http.MethodPut, got.Method)
		require.Equal(t, "/payments/A-1", got.URL.Path)
		require.Equal(t, []string{"idf2_test"}, got.Header.Values("X-Request-Key"))
		require.Empty(t, got.Header.Values("Idempotency-Key"))
		require.Equal(t, "Bearer t", got.Header.Get("Authorization"))
		require.Equal(t, []string{"request"}, got.Header.Values("X-Both"))
		require.Equal(t, "application/vnd.pay+json", got.Header.Get("Content-Type"))
		require.Equal(t, "application/json", got.Header.Get("Accept"))
		require.JSONEq(t, `{"orderId": "A-1", "amount": 7}`, body)
	})

	t.Run("NoBody", func(t *testing.T) {
		t.Parallel()
		var rec recorder
		u := serve(t, func(w http.ResponseWriter, r *http.Request) { rec.record(r) })
		c := httpstep.Call[payIn, payState]{RequestFunc: func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
			return httpstep.Request{URL: u}, nil
		}}
		require.NoError(t, c.Run(t.Context(), at, payIn{}, &payState{}))
		got, _ := rec.last(t)
		require.Equal(t, http.MethodPost, got.Method)
		require.Zero(t, got.ContentLength)
		require.Empty(t, got.Header.Get("Content-Type"))
		require.Equal(t, "idf2_test", got.Header.Get("Idempotency-Key"))
	})

	t.Run("BoundedBody", func(t *testing.T) {
		t.Parallel()
		u := serve(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, strings.Repeat("x", 10+len(r.URL.Query().Get("more"))))
		})
		for _, tc := range []struct {
			more    string
			tooLong bool
		}{{more: "", tooLong: false}, {more: "1", tooLong: true}} {
			c := httpstep.Call[payIn, payState]{MaxBody: 10, RequestFunc: post(u + "?more=" + tc.more)}
			err := c.Run(t.Context(), at, payIn{}, &payState{})
			if !tc.tooLong {
				require.NoError(t, err)
				continue
			}
			require.ErrorIs(t, err, httpstep.ErrBodyTooLarge)
			var pe *engine.PermanentError
			require.False(t, errors.As(err, &pe), "transient")
		}
	})

	t.Run("DefaultBodyBound", func(t *testing.T) {
		t.Parallel()
		u := serve(t, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write(make([]byte, httpstep.DefaultMaxBody+1))
		})
		err := httpstep.Call[payIn, payState]{RequestFunc: post(u)}.Run(t.Context(), at, payIn{}, &payState{})
		require.ErrorIs(t, err, httpstep.ErrBodyTooLarge)
	})

	t.Run("UnreachableIsTransient", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		err := httpstep.Call[payIn, payState]{RequestFunc: post(srv.URL)}.Run(t.Context(), at, payIn{}, &payState{})
		require.Error(t, err)
		var pe *engine.PermanentError
		require.False(t, errors.As(err, &pe), "transient: %v", err)
	})

	t.Run("ContextReachesTheRequest", func(t *testing.T) {
		t.Parallel()
		u := serve(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, `{}`) })
		ctx, cancel := context.WithCancel(t.Context())
		c := httpstep.Call[payIn, payState]{RequestFunc: func(ctx context.Context, _ engine.Attempt, _ payIn, _ *payState) (httpstep.Request, error) {
			cancel() // the request's own context, cancelled before it is sent
			return httpstep.Request{URL: u}, nil
		}}
		err := c.Run(ctx, at, payIn{}, &payState{})
		require.ErrorIs(t, err, context.Canceled)
	})

	t.Run("RequestThatCannotBeMadeIsAServerFault", func(t *testing.T) {
		t.Parallel()
		for name, req := range map[string]httpstep.Request{
			"BodyDoesNotEncode": {URL: "http://127.0.0.1:1/", Body: func() {}},
			"NoURL":             {},
			"BadURL":            {URL: "http://[::1"},
		} {
			c := httpstep.Call[payIn, payState]{RequestFunc: func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
				return req, nil
			}}
			var pe *engine.PermanentError
			require.ErrorAs(t, c.Run(t.Context(), at, payIn{}, &payState{}), &pe, name)
			require.True(t, pe.ServerFault(), name)
		}
	})

	t.Run("RequestFuncErrorIsTheAttempts", func(t *testing.T) {
		t.Parallel()
		c := httpstep.Call[payIn, payState]{RequestFunc: func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
			return httpstep.Request{}, engine.Fail("order_closed", "the order is closed")
		}}
		require.ErrorIs(t, c.Run(t.Context(), at, payIn{}, &payState{}), engine.Fail("order_closed", ""))
	})

	t.Run("ClassifyFuncSeesEveryAnswer", func(t *testing.T) {
		t.Parallel()
		u := serve(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, `{"status": "declined"}`) })
		decoded := false
		c := httpstep.Call[payIn, payState]{
			RequestFunc: post(u),
			ClassifyFunc: func(a httpstep.Answer) error {
				if strings.Contains(string(a.Body), "declined") {
					return engine.Fail("declined", "declined")
				}
				return httpstep.Classify(a)
			},
			DecodeFunc: func(engine.Attempt, payIn, *payState, httpstep.Answer) error { decoded = true; return nil },
		}
		require.ErrorIs(t, c.Run(t.Context(), at, payIn{}, &payState{}), engine.Fail("declined", ""))
		require.False(t, decoded, "a failure is not decoded")
	})

	t.Run("RedirectIsNotFollowed", func(t *testing.T) {
		t.Parallel()
		var rec recorder
		u := serve(t, func(w http.ResponseWriter, r *http.Request) {
			rec.record(r)
			if r.Method == http.MethodGet {
				writeJSON(w, http.StatusOK, `{}`)
				return
			}
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		})
		err := httpstep.Call[payIn, payState]{RequestFunc: post(u)}.Run(t.Context(), at, payIn{}, &payState{})
		var se *httpstep.StatusError
		require.ErrorAs(t, err, &se)
		require.Equal(t, http.StatusFound, se.StatusCode)
		require.Zero(t, rec.count(http.MethodGet), "the POST did not become a GET")
	})

	t.Run("CheckErrorHalts", func(t *testing.T) {
		t.Parallel()
		u := serve(t, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, `{}`) })
		c := httpstep.Call[payIn, payState]{
			RequestFunc: post(u),
			CheckFunc:   func(payIn, *payState) error { return errors.New("amount 2, asked 1") },
		}
		var halt *engine.HaltError
		require.ErrorAs(t, c.Run(t.Context(), at, payIn{}, &payState{}), &halt)
		require.EqualValues(t, httpstep.CodeMismatch, halt.Code)
		require.Contains(t, halt.Message, "amount 2, asked 1")
	})
}

// TestFind calls Call.Find, the step's lookup, directly.
func TestFind(t *testing.T) {
	t.Parallel()

	at := engine.Attempt{Key: "idf2_k/1"}
	for _, tc := range []struct {
		name     string
		status   int
		header   http.Header
		body     string
		notFound func(httpstep.Answer) bool
		// found, or else: none (not made), or an error: halt code, or transient.
		found      bool
		halt       string
		transient  bool
		retryAfter time.Duration
	}{
		{name: "Found", status: 200, body: `{"id": "pay_1", "orderId": "A-1", "amount": 1500}`, found: true},
		{name: "FoundMismatchHalts", status: 200, body: `{"id": "pay_1", "orderId": "A-1", "amount": 1501}`, halt: "payment_mismatch"},
		{name: "FoundUnreadableIsTransient", status: 200, body: `not json`, transient: true},
		{name: "404IsNotMadeWithAnyNotFound", status: 404, body: "404 page not found", notFound: httpstep.AnyNotFound},
		{name: "404OfTheServiceIsNotMade", status: 404, body: `{"error": {"code": "payment_not_found"}}`, notFound: httpstep.HasCode("payment_not_found")},
		// A 404 that is not the service's own says nothing about the payment.
		{name: "404OfSomethingElseIsAnError", status: 404, body: "404 page not found", notFound: httpstep.HasCode("payment_not_found"), transient: true},
		{name: "400IsTransient", status: 400, body: `{"error": {"code": "invalid_key"}}`, transient: true},
		{name: "410IsTransient", status: 410, transient: true},
		{name: "503", status: 503, transient: true},
		{name: "503RetryAfter", status: 503, header: http.Header{"Retry-After": {"3"}}, transient: true, retryAfter: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rec.record(r)
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				writeJSON(w, tc.status, tc.body)
			}))
			t.Cleanup(srv.Close)
			p := &payments{srv: srv}
			c := p.call()
			if tc.notFound != nil {
				c.Lookup.NotFoundFunc = tc.notFound
			}
			var s payState
			found, err := c.Find(t.Context(), at, payIn{OrderID: "A-1", Amount: 1500}, &s)

			got, _ := rec.last(t)
			require.Equal(t, http.MethodGet, got.Method)
			require.Equal(t, "/payments/by-key/"+url.PathEscape(at.Key), got.URL.EscapedPath())
			require.Equal(t, at.Key, got.Header.Get("Idempotency-Key"))
			require.Equal(t, "Bearer test-token", got.Header.Get("Authorization"))
			require.Equal(t, tc.found, found)
			switch {
			case tc.found:
				require.NoError(t, err)
				require.Equal(t, payment{ID: "pay_1", OrderID: "A-1", Amount: 1500}, s.Payment, "decoded by the call's DecodeFunc")
			case tc.halt != "":
				var halt *engine.HaltError
				require.ErrorAs(t, err, &halt)
				require.EqualValues(t, tc.halt, halt.Code)
			case tc.transient:
				require.Error(t, err)
				var pe *engine.PermanentError
				require.False(t, errors.As(err, &pe), "a lookup's error is never permanent: %v", err)
				var halt *engine.HaltError
				require.False(t, errors.As(err, &halt))
				var ra *engine.RetryAfterError
				if tc.retryAfter != 0 {
					require.ErrorAs(t, err, &ra)
					require.Equal(t, tc.retryAfter, ra.After)
				}
			default:
				require.NoError(t, err)
			}
		})
	}

	t.Run("LookupDecodeFunc", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, `{"payment": {"id": "pay_9", "orderId": "A-1", "amount": 1500}, "requests": 2}`)
		}))
		t.Cleanup(srv.Close)
		c := (&payments{srv: srv}).call()
		c.Lookup.DecodeFunc = func(_ engine.Attempt, _ payIn, s *payState, a httpstep.Answer) error {
			var rec struct {
				Payment payment `json:"payment"`
			}
			err := json.Unmarshal(a.Body, &rec)
			s.Payment = rec.Payment
			return err
		}
		var s payState
		found, err := c.Find(t.Context(), at, payIn{OrderID: "A-1", Amount: 1500}, &s)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, "pay_9", s.Payment.ID)
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		found, err := (&payments{srv: srv}).call().Find(t.Context(), at, payIn{}, &payState{})
		require.Error(t, err)
		require.False(t, found)
	})
}

func TestStepPanicsOnAnInvalidCall(t *testing.T) {
	t.Parallel()
	request := func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
		return httpstep.Request{}, nil
	}
	for name, c := range map[string]httpstep.Call[payIn, payState]{
		"NoRequestFunc":    {},
		"LookupWithoutURL": {RequestFunc: request, Lookup: &httpstep.Lookup[payIn, payState]{NotFoundFunc: httpstep.AnyNotFound}},
		"LookupWithoutNotFoundFunc": {RequestFunc: request, Lookup: &httpstep.Lookup[payIn, payState]{
			URLFunc: func(engine.Attempt, payIn, *payState) string { return "http://example.invalid/by-key" },
		}},
		"NegativeMaxBody": {RequestFunc: request, MaxBody: -1},
	} {
		require.Panics(t, func() { httpstep.Step("pay", c) }, name)
	}
	require.NotPanics(t, func() { httpstep.Step("pay", httpstep.Call[payIn, payState]{RequestFunc: request}) })
}

// TestRunRefusedAfterAnEarlierAttempt: without a lookup, a refusal of a
// repeated attempt halts instead of failing (which would compensate): the
// earlier attempt may have gone through. With a lookup, or on a first attempt,
// it is the refusal it says.
func TestRunRefusedAfterAnEarlierAttempt(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = w.Write([]byte(`{"code":"insufficient_funds","message":"the account cannot pay it"}`))
	}))
	t.Cleanup(srv.Close)
	call := httpstep.Call[payIn, payState]{
		RequestFunc: func(context.Context, engine.Attempt, payIn, *payState) (httpstep.Request, error) {
			return httpstep.Request{URL: srv.URL + "/payments", Body: map[string]int{"amount": 1}}, nil
		},
	}
	withLookup := call
	withLookup.Lookup = &httpstep.Lookup[payIn, payState]{
		URLFunc:      func(engine.Attempt, payIn, *payState) string { return srv.URL + "/by-key" },
		NotFoundFunc: httpstep.HasCode("payment_not_found"),
	}
	for _, tt := range []struct {
		name    string
		call    httpstep.Call[payIn, payState]
		attempt int
		halt    bool
	}{
		{"FirstAttempt", call, 1, false},
		{"RepeatedWithoutLookup", call, 2, true},
		{"RepeatedWithLookup", withLookup, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.call.Run(t.Context(), engine.Attempt{Key: "k", Number: tt.attempt}, payIn{}, &payState{})
			var halt *engine.HaltError
			var pe *engine.PermanentError
			if tt.halt {
				require.ErrorAs(t, err, &halt)
				require.EqualValues(t, "insufficient_funds", halt.Code)
			} else {
				require.ErrorAs(t, err, &pe)
				require.EqualValues(t, "insufficient_funds", pe.Code)
			}
		})
	}
}
