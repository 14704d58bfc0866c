package opsweb_test

import (
	"context"
	"encoding/base64"
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

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/reconcile"
)

const adminToken = "ops-secret"

// The modes of the test operation, its input: how it goes wrong until it is
// healed.
const (
	modeOK = "ok"
	// modeFail: the charge fails transiently until healed; out of attempts,
	// its lookup finds nothing and the reservation is compensated: failed.
	modeFail = "fail"
	// modeHaltBefore: the reservation halts: parked before the pivot.
	modeHaltBefore = "halt_before"
	// modeHaltAfter: the record halts after the charge: parked past the pivot.
	modeHaltAfter = "halt_after"
	// modeMismatch: the card network holds another charge under the
	// charge's derived key: the charge, and its lookup, halt with an error
	// that names the network's internal URL, as httpstep's do.
	modeMismatch = "mismatch"
)

// internalURL is the card network's address, which no operator's answer
// names.
const internalURL = "http://10.0.0.7:8443/charges/by-key/"

// mismatched is the error of the charge and its lookup in modeMismatch.
func mismatched(at engine.Attempt) error {
	return fmt.Errorf("httpstep: read the answer of GET %s%s: %w", internalURL, at.Key,
		engine.Halt("charge_mismatch", "the network's charge under the derived key is for another amount"))
}

type payIn struct {
	Mode string `json:"mode"`
}

type payState struct {
	Charged bool `json:"charged"`
}

// payoutIn is the input of the test operation "payout", which waits for
// Need approvals (none: passes at once) that expire after Expires (zero:
// never); Halt parks it at its first step, before it waits.
type payoutIn struct {
	Need    int           `json:"need"`
	Expires time.Duration `json:"expires"`
	Halt    bool          `json:"halt"`
}

type payoutState struct {
	Released bool `json:"released"`
}

// bundle is a test's engine, operation and server.
type bundle struct {
	t    *testing.T
	e    *engine.Engine
	pool *pgxpool.Pool
	op   *engine.Operation[payIn, payState, bool]
	// payout waits for approvals: reserve, approval, send.
	payout *engine.Operation[payoutIn, payoutState, bool]
	srv    *httptest.Server
	healed sync.Map // operation key -> true: the cause is mended
	// provider is the reconciliation source "provider" of the engine, which
	// runs only when asked.
	provider *provider
}

// provider is an outside service's records, listed in one page.
type provider struct {
	mu      sync.Mutex
	records []reconcile.Record
	err     error
}

// add lists r from now on, made now unless it says when.
func (p *provider) add(r reconcile.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.CreatedAt.IsZero() {
		r.CreatedAt = time.Now()
	}
	p.records = append(p.records, r)
}

// fail makes the listing fail with err; nil mends it.
func (p *provider) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

func (p *provider) list(_ context.Context, req reconcile.ListRequest) ([]reconcile.Record, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, "", p.err
	}
	var page []reconcile.Record
	for _, r := range p.records {
		if r.CreatedAt.After(req.Since) {
			page = append(page, r)
		}
	}
	return page, "", nil
}

// setup returns an engine on a database of the test's own, with the test
// operations "payment" (reserve, charge: a pivot, record) and "payout"
// (reserve, approval, send), and a server with
// the pages at /ops and the JSON API at /admin, as the demo mounts them. The
// engine reconciles the source "provider" (b.provider) when asked.
func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{t: t, provider: &provider{}}
	broken := func(at engine.Attempt, in payIn, mode string) bool {
		_, ok := b.healed.Load(at.OperationKey)
		return in.Mode == mode && !ok
	}
	reserve := func(_ context.Context, _ engine.Tx, at engine.Attempt, in payIn, _ *payState) error {
		if broken(at, in, modeHaltBefore) {
			return engine.Halt("limit_unknown", "the risk service gave no limit for this account")
		}
		return nil
	}
	release := func(context.Context, engine.Tx, engine.Attempt, payIn, *payState) error { return nil }
	charge := func(_ context.Context, at engine.Attempt, in payIn, s *payState) error {
		if broken(at, in, modeFail) {
			return errors.New("charge: dial tcp 10.0.0.7:443: connection refused")
		}
		if broken(at, in, modeMismatch) {
			return mismatched(at)
		}
		s.Charged = true
		return nil
	}
	lookup := func(_ context.Context, at engine.Attempt, in payIn, _ *payState) (bool, error) {
		if broken(at, in, modeMismatch) {
			return false, mismatched(at)
		}
		return false, nil
	}
	record := func(_ context.Context, _ engine.Tx, at engine.Attempt, in payIn, _ *payState) error {
		if broken(at, in, modeHaltAfter) {
			return engine.Halt("ledger_mismatch", "the ledger holds another amount for this charge")
		}
		return nil
	}
	op, err := engine.NewOperation("payment", []engine.Step[payIn, payState]{
		engine.TxStep("reserve", reserve).Compensate(release),
		engine.ExternalStep("charge", charge).Lookup(lookup).Window(0), // the card network answers for good or never
		engine.TxStep("record", record),
	}, func(_ payIn, s *payState) (bool, error) { return s.Charged, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	b.op = op
	b.payout, err = engine.NewOperation("payout", []engine.Step[payoutIn, payoutState]{
		engine.TxStep("reserve", func(_ context.Context, _ engine.Tx, _ engine.Attempt, in payoutIn, _ *payoutState) error {
			if in.Halt {
				return engine.Halt("limit_unknown", "the risk service gave no limit for this account")
			}
			return nil
		}).Compensate(func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ payoutIn, s *payoutState) error {
			s.Released = true
			return nil
		}),
		engine.ApprovalStep("approval", func(in payoutIn, _ *payoutState) engine.ApprovalPolicy {
			return engine.ApprovalPolicy{Need: in.Need, Expires: engine.Deadline{After: in.Expires}}
		}),
		engine.TxStep("send", func(context.Context, engine.Tx, engine.Attempt, payoutIn, *payoutState) error { return nil }),
	}, func(payoutIn, *payoutState) (bool, error) { return true, nil }, nil)
	require.NoError(t, err)
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	b.pool = idemflowtest.Pool(t, nil)
	b.e = idemflowtest.Engine(t, b.pool, &engine.Config{Logger: logger, Reconcile: reconcile.Config{
		Sources: []reconcile.Source{{Name: "provider", List: b.provider.list}}, Interval: -1,
	}}, op, b.payout)
	h, err := opsweb.New(b.e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken), APIPath: "/admin", Logger: logger,
		ReconcileSources: []string{"provider"}})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops", h)
	mux.Handle("/ops/", h)
	mux.Handle("/admin/", h)
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

// start runs an operation to its end, or until it is parked.
func (b *bundle) start(scope, key, mode string) *engine.Info {
	b.t.Helper()
	started, err := engine.Start(b.t.Context(), b.e, b.op, scope, key, payIn{Mode: mode}, nil)
	require.NoError(b.t, err)
	return idemflowtest.Wait(b.t, b.e, started)
}

// waitFor reads the operation until it is no longer in progress, or parked.
func (b *bundle) waitFor(id string) *engine.Info {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.t.Context(), 30*time.Second)
	defer cancel()
	info, err := b.e.Wait(ctx, uuidOf(b.t, id))
	require.NoError(b.t, err)
	info, err = b.e.Get(ctx, info.ID)
	require.NoError(b.t, err)
	return info
}

// response is an answer with its body read.
type response struct {
	status int
	header http.Header
	body   string
}

// request options: header pairs.
func (b *bundle) do(method, path, body string, header ...string) *response {
	b.t.Helper()
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(b.t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return &response{status: resp.StatusCode, header: resp.Header, body: string(raw)}
}

// admin sends a request with the admin token, as a bearer token.
func (b *bundle) admin(method, path, body string, header ...string) *response {
	b.t.Helper()
	return b.do(method, path, body, append([]string{"Authorization", "Bearer " + adminToken}, header...)...)
}

// browser sends a request as a browser on the pages does: Basic credentials,
// Accept text/html, a same-origin fetch.
func (b *bundle) browser(method, path string, form url.Values) *response {
	b.t.Helper()
	return b.browserAs("anyone", method, path, form)
}

// browserAs is browser with user as the Basic credentials' user name.
func (b *bundle) browserAs(user, method, path string, form url.Values) *response {
	b.t.Helper()
	header := []string{"Authorization", basic(user, adminToken), "Accept", "text/html,application/xhtml+xml;q=0.9,*/*;q=0.8",
		"Sec-Fetch-Site", "same-origin", "Origin", b.srv.URL}
	body := ""
	if form != nil {
		body = form.Encode()
		header = append(header, "Content-Type", "application/x-www-form-urlencoded")
	}
	return b.do(method, path, body, header...)
}

func basic(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param"`
}

func requireError(t *testing.T, r *response, status int, code string) apiError {
	t.Helper()
	require.Equal(t, status, r.status, "body %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"), "body %s", r.body)
	var body struct {
		Error *apiError `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &body), "body %s", r.body)
	require.NotNil(t, body.Error, "body %s", r.body)
	require.EqualValues(t, code, body.Error.Code, "body %s", r.body)
	require.NotEmpty(t, body.Error.Message)
	return *body.Error
}

// The API's objects, as the package documentation gives them.
type (
	item struct {
		OperationID    string     `json:"operationId"`
		Client         string     `json:"client"`
		Name           string     `json:"name"`
		Version        int        `json:"version"`
		Key            string     `json:"key"`
		Status         string     `json:"status"`
		NeedsAttention bool       `json:"needsAttention"`
		CreatedAt      time.Time  `json:"createdAt"`
		FinishedAt     *time.Time `json:"finishedAt"`
	}
	operation struct {
		item
		Parked    bool `json:"parked"`
		Attention *struct {
			Code   string `json:"code"`
			Reason string `json:"reason"`
		} `json:"attention"`
		Failure *struct {
			Code        string `json:"code"`
			Message     string `json:"message"`
			Cause       string `json:"cause"`
			Step        string `json:"step"`
			ServerFault bool   `json:"serverFault"`
		} `json:"failure"`
		Runs   int             `json:"runs"`
		Result json.RawMessage `json:"result"`
		Steps  []step          `json:"steps"`
		Audit  []struct {
			At     time.Time `json:"at"`
			Action string    `json:"action"`
			Actor  string    `json:"actor"`
			Reason string    `json:"reason"`
			Result string    `json:"result"`
			Detail string    `json:"detail"`
		} `json:"audit"`
		Mismatches []mismatch `json:"mismatches"`
	}
	mismatch struct {
		Source          string          `json:"source"`
		Kind            string          `json:"kind"`
		Key             string          `json:"key"`
		Reference       string          `json:"reference"`
		Amount          int64           `json:"amount"`
		RecordStatus    string          `json:"recordStatus"`
		RecordCreatedAt time.Time       `json:"recordCreatedAt"`
		Data            json.RawMessage `json:"data"`
		Step            string          `json:"step"`
		Detail          string          `json:"detail"`
		FirstSeen       time.Time       `json:"firstSeen"`
		LastSeen        time.Time       `json:"lastSeen"`
	}
	// mismatchItem is a mismatch of GET /admin/mismatches.
	mismatchItem struct {
		mismatch
		OperationID     *string `json:"operationId"`
		Operation       string  `json:"operation"`
		Client          string  `json:"client"`
		OperationStatus string  `json:"operationStatus"`
	}
	step struct {
		Name       string     `json:"name"`
		Kind       string     `json:"kind"`
		Status     string     `json:"status"`
		Attempts   int        `json:"attempts"`
		DerivedKey string     `json:"derivedKey"`
		ResolvedBy string     `json:"resolvedBy"`
		SettleBy   *time.Time `json:"settleBy"`
		StartedAt  *time.Time `json:"startedAt"`
		FinishedAt *time.Time `json:"finishedAt"`
		LastError  *string    `json:"lastError"`
		LastCause  *string    `json:"lastCause"`
		Wait       *struct {
			Reason     string     `json:"reason"`
			Since      *time.Time `json:"since"`
			Until      *time.Time `json:"until"`
			Signal     string     `json:"signal"`
			Need       int        `json:"need"`
			ApprovedBy []string   `json:"approvedBy"`
		} `json:"wait"`
	}
)

// decode decodes a 200's JSON into a T, refusing members that T lacks.
func decode[T any](t *testing.T, r *response) T {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var v T
	dec := json.NewDecoder(strings.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&v), "body %s", r.body)
	return v
}

func (b *bundle) list(query string) ([]item, *response) {
	b.t.Helper()
	r := b.admin(http.MethodGet, "/admin/operations"+query, "")
	body := decode[struct {
		Operations []item `json:"operations"`
	}](b.t, r)
	require.NotNil(b.t, body.Operations, "operations must be [], not null")
	return body.Operations, r
}

func ids(items []item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.OperationID
	}
	return out
}

func uuidOf(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}
