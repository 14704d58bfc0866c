package idempotency_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/internal/testdb"
)

// The test operation charges an account: a database step records the charge, then
// a step that stands for a call out settles it. The account name tells the
// operation how to behave:
//
//	unknown    the record step fails: 404 account_not_found, nothing recorded
//	declined   the settle step fails: 402 card_declined, with details
//	blocked    the settle step waits until the test releases the gate
//	flaky      the settle step fails transiently once, then succeeds
//	broken     the settle step always fails transiently (attempts exhausted)
//
// Any other account succeeds.

type chargeIn struct {
	Account  string         `json:"account"`
	Amount   int64          `json:"amount"`
	Options  map[string]any `json:"options,omitempty"`
	Metadata map[string]any `json:"metadata,omitempty"`
}

type chargeState struct {
	ChargeID int64 `json:"chargeId"`
}

type chargeOut struct {
	ChargeID int64  `json:"chargeId"`
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
}

const chargeSchema = `CREATE TABLE test_charge (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`

func decodeCharge(_ *http.Request, f idempotency.Fields) (chargeIn, error) {
	var in chargeIn
	err := cmp.Or(
		f.Only("account", "amount", "options", "metadata"),
		f.Required("account", &in.Account),
		f.Required("amount", &in.Amount),
		f.Optional("options", &in.Options),
		f.Optional("metadata", &in.Metadata),
	)
	if err == nil && in.Amount <= 0 {
		err = &idempotency.FieldError{Param: "amount", Message: "must be a positive integer"}
	}
	return in, err
}

func chargeErrorStatus(code string) int {
	switch code {
	case "account_not_found":
		return http.StatusNotFound
	case "card_declined":
		return http.StatusPaymentRequired
	}
	return 0
}

// harness is an engine on a database of its own, the charge operation mounted at
// every path of a test server, and the controls of the operation.
type harness struct {
	pool *pgxpool.Pool
	e    *engine.Engine
	op   *engine.Operation[chargeIn, chargeState, chargeOut]
	srv  *httptest.Server
	// gate blocks the settle step of "blocked" accounts until release.
	gate    chan struct{}
	release func()
	flaky   atomic.Int32
	// outcomes are what Config.ObserveFunc was told, in order.
	mu       sync.Mutex
	outcomes []string
}

func (h *harness) observed() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.outcomes...)
}

type harnessOpts struct {
	// wait is Config.Wait; 0 means a minute, which no test operation needs
	// unless it is blocked.
	wait       time.Duration
	retryAfter time.Duration
	// workers starts the River workers, which run retries.
	workers bool
	// maxAttempts is the attempts of a step failing transiently; default 3.
	maxAttempts int
	// perScope is engine.Config.MaxInFlightPerScope.
	perScope int
}

func setup(t *testing.T, opts harnessOpts) *harness {
	t.Helper()
	ctx := context.Background()
	h := &harness{pool: testdb.Pool(t), gate: make(chan struct{})}
	var once sync.Once
	h.release = func() { once.Do(func() { close(h.gate) }) }
	_, err := h.pool.Exec(ctx, chargeSchema)
	require.NoError(t, err)

	h.op, err = engine.NewOperation("charge", []engine.Step[chargeIn, chargeState]{
		engine.TxStep("record", h.record),
		// The lookup finds nothing: no settle call ever goes through when it
		// fails, nor lands later (no settle window).
		engine.ExternalStep("settle", h.settle).Lookup(func(context.Context, engine.Attempt, chargeIn, *chargeState) (bool, error) { return false, nil }).Window(0),
	}, func(in chargeIn, s *chargeState) (chargeOut, error) {
		return chargeOut{ChargeID: s.ChargeID, Account: in.Account, Amount: in.Amount}, nil
	}, &engine.OperationOpts{Retry: engine.RetryPolicy{Base: 10 * time.Millisecond, MaxAttempts: cmp.Or(opts.maxAttempts, 3)}})
	require.NoError(t, err)
	h.e, err = engine.New(h.pool, &engine.Config{
		Operations:          []engine.Definition{h.op},
		PollInterval:        20 * time.Millisecond,
		SweepInterval:       50 * time.Millisecond,
		MaxInFlightPerScope: opts.perScope,
	})
	require.NoError(t, err)
	if opts.workers {
		require.NoError(t, h.e.StartWorkers(ctx))
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		require.NoError(t, h.e.Stop(stopCtx))
	})
	// Cleanups run last in, first out: a blocked operation ends before Stop.
	t.Cleanup(h.release)

	handler, err := idempotency.Handler(&idempotency.Config{
		Engine:     h.e,
		ScopeFunc:  bearerScope,
		Wait:       cmp.Or(opts.wait, time.Minute),
		RetryAfter: opts.retryAfter,
		ObserveFunc: func(_ context.Context, op string, o idempotency.Outcome) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.outcomes = append(h.outcomes, op+":"+string(o))
		},
	}, h.op, &idempotency.EndpointOpts[chargeIn]{
		DecodeFunc:      decodeCharge,
		Unfingerprinted: []string{"metadata"},
		ErrorStatusFunc: chargeErrorStatus,
	})
	require.NoError(t, err)
	h.srv = httptest.NewServer(handler)
	t.Cleanup(h.srv.Close)
	return h
}

// bearerScope makes the bearer token the client scope.
func bearerScope(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", errors.New("a bearer token is required")
	}
	return token, nil
}

func (h *harness) record(ctx context.Context, tx engine.Tx, _ engine.Attempt, in chargeIn, s *chargeState) error {
	if in.Account == "unknown" {
		return engine.Fail("account_not_found", "there is no account "+in.Account)
	}
	return tx.QueryRow(ctx, `INSERT INTO test_charge (account, amount) VALUES ($1, $2) RETURNING id`, in.Account, in.Amount).Scan(&s.ChargeID)
}

func (h *harness) settle(ctx context.Context, _ engine.Attempt, in chargeIn, _ *chargeState) error {
	switch in.Account {
	case "declined":
		return &engine.PermanentError{Code: "card_declined", Message: "the card was declined",
			Details: json.RawMessage(`{"retryable": false, "declineCode": "insufficient_funds", "limit": 1.50e2}`)}
	case "blocked":
		select {
		case <-h.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	case "flaky":
		if h.flaky.Add(1) == 1 {
			return errors.New("the provider is unavailable")
		}
	case "broken":
		return errors.New("the provider is unavailable")
	}
	return nil
}

// counts returns how many charges were recorded and how many operations exist.
func (h *harness) counts(t *testing.T) (charges, operations int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM test_charge`).Scan(&charges))
	require.NoError(t, h.pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation`).Scan(&operations))
	return charges, operations
}

// request is one HTTP request to the harness's server.
type request struct {
	method string // default POST
	path   string // default /charges
	// scope is the bearer token; "-" sends none. Default "client-a".
	scope string
	// keys are the Idempotency-Key header fields; nil sends one, "key-1".
	keys  []string
	noKey bool
	body  string
	// chunked sends the body without a Content-Length.
	chunked bool
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(t *testing.T, req request) response {
	t.Helper()
	res, err := h.send(req)
	require.NoError(t, err)
	return res
}

// send is do for goroutines other than the test's.
func (h *harness) send(req request) (response, error) {
	var body io.Reader = strings.NewReader(req.body)
	if req.chunked {
		body = io.MultiReader(body) // hides the length
	}
	r, err := http.NewRequest(cmp.Or(req.method, http.MethodPost), h.srv.URL+cmp.Or(req.path, "/charges"), body)
	if err != nil {
		return response{}, err
	}
	r.Header.Set("Content-Type", "application/json")
	if scope := cmp.Or(req.scope, "client-a"); scope != "-" {
		r.Header.Set("Authorization", "Bearer "+scope)
	}
	keys := req.keys
	if keys == nil {
		keys = []string{"key-1"}
	}
	if !req.noKey {
		for _, k := range keys {
			r.Header.Add("Idempotency-Key", k)
		}
	}
	res, err := h.srv.Client().Do(r)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: raw}, err
}

// apiError is the body of an error answer.
type apiError struct {
	Error struct {
		Code             string   `json:"code"`
		Message          string   `json:"message"`
		Param            string   `json:"param"`
		MismatchedFields []string `json:"mismatchedFields"`
	} `json:"error"`
}

func decodeError(t *testing.T, body []byte) apiError {
	t.Helper()
	var e apiError
	require.NoError(t, json.Unmarshal(body, &e), "body: %s", body)
	return e
}
