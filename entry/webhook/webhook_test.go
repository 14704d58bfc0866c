package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/idemflowtest"
)

// The test operation records a payment event: its one step writes a row per
// run, with no unique key, so that a second run of an event would show as a
// second row.

type payment struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Amount int64  `json:"amount"`
}

type recorded struct {
	EffectID int64 `json:"effectId"`
}

const effectSchema = `CREATE TABLE webhook_effect (id bigserial PRIMARY KEY, event_id text NOT NULL, amount bigint NOT NULL)`

func record(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payment, s *recorded) error {
	return tx.QueryRow(ctx, `INSERT INTO webhook_effect (event_id, amount) VALUES ($1, $2) RETURNING id`, in.ID, in.Amount).Scan(&s.EffectID)
}

func newPaymentOp(t *testing.T, name string, steps ...engine.Step[payment, recorded]) *engine.Operation[payment, recorded, recorded] {
	t.Helper()
	op, err := engine.NewOperation(name, append([]engine.Step[payment, recorded]{engine.TxStep("record", record)}, steps...),
		func(_ payment, s *recorded) (recorded, error) { return *s, nil }, nil)
	require.NoError(t, err)
	return op
}

const scope = "webhook:test"

// quiet keeps the engines' and River's info lines out of the test output.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// harness is one database with the effect table, an engine running the
// payment operation, and the handler's defaults.
type harness struct {
	pool *pgxpool.Pool
	e    *engine.Engine
	op   *engine.Operation[payment, recorded, recorded]
}

func setup(t *testing.T) *harness {
	t.Helper()
	pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, effectSchema)
		return err
	})
	op := newPaymentOp(t, "payment")
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, op)
	return &harness{pool: pool, e: e, op: op}
}

// config is the tests' base configuration: both secrets, the test clock.
func config() *webhook.Config[payment] {
	return &webhook.Config[payment]{
		Scope:   scope,
		Secrets: [][]byte{secretOld, secretNew},
		Logger:  quiet,
		Test:    webhook.TestConfig{NowFunc: func() time.Time { return clock }},
	}
}

// server serves a handler of op made with cfg.
func server[S, Out any](t *testing.T, e *engine.Engine, op *engine.Operation[payment, S, Out], cfg *webhook.Config[payment]) *httptest.Server {
	t.Helper()
	h, err := webhook.Handler(e, op, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// answer is a delivery's answer.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// code returns the answer's error code, "" for none.
func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

// deliver posts body to srv with the header Provider-Signature: sig (none when
// sig is empty) and the other headers given as name, value pairs.
func deliver(t *testing.T, srv *httptest.Server, body []byte, sig string, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	require.NoError(t, err)
	if sig != "" {
		req.Header.Set(webhook.DefaultHeader, sig)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "answer %d %s", a.status, raw)
	require.NoError(t, json.Unmarshal(raw, &a.body), "answer %d %s", a.status, raw)
	return a
}

// event is the body of a payment event.
func event(id string, amount int64) []byte {
	return fmt.Appendf(nil, `{"id":%q,"type":"payment.succeeded","amount":%d,"pending_webhooks":1}`, id, amount)
}

// effects counts the rows written for the event id.
func (h *harness) effects(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_effect WHERE event_id = $1`, id).Scan(&n))
	return n
}

// requireNothingRecorded checks that the event id has neither an operation
// nor an effect.
func (h *harness) requireNothingRecorded(t *testing.T, id string) {
	t.Helper()
	_, err := h.e.GetByKey(context.Background(), scope, id)
	require.ErrorIs(t, err, engine.ErrNotFound)
	require.Zero(t, h.effects(t, id))
}

// waitFor waits for the operation of the event id to finish. (idemflowtest.Wait
// takes the *engine.Started that only engine.Start makes.)
func waitFor(t *testing.T, e *engine.Engine, id string) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := e.GetByKey(ctx, scope, id)
	require.NoError(t, err)
	info, err = e.Wait(ctx, info.ID)
	require.NoError(t, err)
	return info
}

func requireReceived(t *testing.T, a answer, duplicate bool) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.raw)
	want := `{"received":true}`
	if duplicate {
		want = `{"received":true,"duplicate":true}`
	}
	require.Equal(t, want, a.raw)
	require.NotEmpty(t, a.header.Get("Operation-Id"))
}

func TestHandler(t *testing.T) {
	t.Parallel()
	h := setup(t)
	srv := server(t, h.e, h.op, config())

	t.Run("first delivery", func(t *testing.T) {
		t.Parallel()
		body := event("evt_first", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		requireReceived(t, a, false)

		info := waitFor(t, h.e, "evt_first")
		require.Equal(t, a.header.Get("Operation-Id"), info.ID.String())
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, 1, h.effects(t, "evt_first"))
	})

	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		body := event("evt_dup", 100)
		first := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		requireReceived(t, first, false)
		// The provider delivers again, later (signed again, within the
		// tolerance), with the other secret, and with a body whose
		// pending_webhooks changed, which the input does not keep.
		for i, again := range [][]byte{body, body, bytes.Replace(body, []byte(`"pending_webhooks":1`), []byte(`"pending_webhooks":0`), 1)} {
			a := deliver(t, srv, again, webhook.Sign([][]byte{secretOld, secretNew}[i%2], clock.Add(time.Duration(i)*time.Minute), again))
			requireReceived(t, a, true)
			require.Equal(t, first.header.Get("Operation-Id"), a.header.Get("Operation-Id"))
		}
		require.Equal(t, 1, h.effects(t, "evt_dup"))
	})

	t.Run("concurrent deliveries", func(t *testing.T) {
		t.Parallel()
		const n = 10
		body := event("evt_concurrent", 100)
		answers := make([]answer, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = deliver(t, srv, body, webhook.Sign(secretOld, clock.Add(time.Duration(i)*time.Second), body))
			})
		}
		close(start)
		wg.Wait()
		firsts := 0
		for _, a := range answers {
			require.Equal(t, http.StatusOK, a.status, a.raw)
			require.Equal(t, true, a.body["received"], a.raw)
			require.Equal(t, answers[0].header.Get("Operation-Id"), a.header.Get("Operation-Id"))
			if a.body["duplicate"] == nil {
				firsts++
			}
		}
		require.Equal(t, 1, firsts, "exactly one delivery without duplicate")
		require.Equal(t, engine.StatusSucceeded, waitFor(t, h.e, "evt_concurrent").Status)
		require.Equal(t, 1, h.effects(t, "evt_concurrent"))
	})

	t.Run("another event under the same id", func(t *testing.T) {
		t.Parallel()
		body := event("evt_reused", 100)
		first := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		requireReceived(t, first, false)
		other := event("evt_reused", 999)
		a := deliver(t, srv, other, webhook.Sign(secretOld, clock, other))
		require.Equal(t, http.StatusUnprocessableEntity, a.status, a.raw)
		require.Equal(t, "idempotency_key_reused", a.code())
		require.Equal(t, []any{"amount"}, a.body["error"].(map[string]any)["mismatchedFields"])
		require.Equal(t, first.header.Get("Operation-Id"), a.header.Get("Operation-Id"))
		require.Equal(t, engine.StatusSucceeded, waitFor(t, h.e, "evt_reused").Status)
		require.Equal(t, 1, h.effects(t, "evt_reused"))
	})

	t.Run("oversize body", func(t *testing.T) {
		t.Parallel()
		srv := server(t, h.e, h.op, func() *webhook.Config[payment] { c := config(); c.MaxBodyBytes = 64; return c }())
		body := fmt.Appendf(nil, `{"id":"evt_large","amount":1,"pad":%q}`, strings.Repeat("x", 64))
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusRequestEntityTooLarge, a.status, a.raw)
		require.Equal(t, "request_too_large", a.code())
		h.requireNothingRecorded(t, "evt_large")

		// A chunked body, which has no Content-Length, is cut at the bound too.
		req, err := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(bytes.NewReader(body)))
		require.NoError(t, err)
		req.ContentLength = -1 // unknown: sent chunked
		req.Header.Set(webhook.DefaultHeader, webhook.Sign(secretOld, clock, body))
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		h.requireNothingRecorded(t, "evt_large")

		// At the bound: accepted.
		body = fmt.Appendf(nil, `{"id":"evt_fits","amount":1,"pad":%q}`, strings.Repeat("x", 64-37))
		require.Len(t, body, 64)
		requireReceived(t, deliver(t, srv, body, webhook.Sign(secretOld, clock, body)), false)
	})

	t.Run("ignored", func(t *testing.T) {
		t.Parallel()
		cfg := config()
		cfg.EventFunc = func(_ *http.Request, body []byte) (webhook.Event, payment, error) {
			var p payment
			if err := json.Unmarshal(body, &p); err != nil {
				return webhook.Event{}, p, err
			}
			if p.Type != "payment.succeeded" {
				return webhook.Event{}, p, webhook.ErrIgnore
			}
			return webhook.Event{ID: p.ID, Type: p.Type}, p, nil
		}
		srv := server(t, h.e, h.op, cfg)
		body := []byte(`{"id":"evt_ignored","type":"customer.created"}`)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, `{"received":true,"ignored":true}`, a.raw)
		h.requireNothingRecorded(t, "evt_ignored")
	})

	// Refusals: nothing is recorded.
	refusals := []struct {
		name   string
		id     string
		body   []byte // defaults to event(id, 100)
		sig    func(body []byte) string
		header []string // more headers, as name, value pairs
		code   string
		msg    string // the error's message, when the test names it
	}{
		{name: "missing header", id: "evt_r_missing", sig: func([]byte) string { return "" }, code: webhook.CodeInvalidSignature,
			msg: "no signature header: Provider-Signature"},
		{name: "header twice", id: "evt_r_twice", sig: func(b []byte) string { return webhook.Sign(secretOld, clock, b) },
			header: []string{webhook.DefaultHeader, "t=1,v1=00"}, code: webhook.CodeInvalidSignature},
		{name: "malformed header", id: "evt_r_malformed", sig: func([]byte) string { return "v1=abc;t=now" }, code: webhook.CodeInvalidSignature},
		{name: "bad signature", id: "evt_r_bad", sig: func(b []byte) string { return webhook.Sign([]byte("whsec_guess"), clock, b) }, code: webhook.CodeInvalidSignature,
			msg: "no signature matches the body"},
		{name: "signature of another body", id: "evt_r_other", sig: func([]byte) string { return webhook.Sign(secretOld, clock, event("evt_r_other", 1)) }, code: webhook.CodeInvalidSignature},
		{name: "old timestamp", id: "evt_r_old", sig: func(b []byte) string { return webhook.Sign(secretOld, clock.Add(-6*time.Minute), b) }, code: webhook.CodeInvalidSignature,
			msg: "the signature's timestamp is outside the tolerance: signed at 2023-11-14T22:07:20Z, 6m0s ago (tolerance 5m0s)"},
		{name: "future timestamp", id: "evt_r_future", sig: func(b []byte) string { return webhook.Sign(secretOld, clock.Add(6*time.Minute), b) }, code: webhook.CodeInvalidSignature,
			msg: "the signature's timestamp is outside the tolerance: signed at 2023-11-14T22:19:20Z, 6m0s ahead (tolerance 5m0s)"},
		{name: "not JSON", id: "evt_r_json", body: []byte(`id=evt_r_json`), code: webhook.CodeInvalidEvent},
		{name: "not an object", id: "evt_r_array", body: []byte(`["evt_r_array"]`), code: webhook.CodeInvalidEvent},
		{name: "no id", id: "", body: []byte(`{"type":"payment.succeeded","amount":1}`), code: webhook.CodeInvalidEvent},
		{name: "empty id", id: "", body: []byte(`{"id":"","amount":1}`), code: webhook.CodeInvalidEvent},
		{name: "id not a string", id: "7", body: []byte(`{"id":7,"amount":1}`), code: webhook.CodeInvalidEvent},
		{name: "id too long", id: strings.Repeat("e", 256), code: webhook.CodeInvalidEvent},
		{name: "id with a NUL", id: "evt\x00", body: []byte(`{"id":"evt\u0000","amount":1}`), code: webhook.CodeInvalidEvent},
		{name: "input does not decode", id: "evt_r_decode", body: []byte(`{"id":"evt_r_decode","amount":"much"}`), code: webhook.CodeInvalidEvent,
			msg: "the event's member amount has the wrong type"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := tt.body
			if body == nil {
				body = event(tt.id, 100)
			}
			sig := webhook.Sign(secretOld, clock, body)
			if tt.sig != nil {
				sig = tt.sig(body)
			}
			a := deliver(t, srv, body, sig, tt.header...)
			require.Equal(t, http.StatusBadRequest, a.status, a.raw)
			require.Equal(t, tt.code, a.code(), a.raw)
			msg := a.body["error"].(map[string]any)["message"]
			require.NotEmpty(t, msg)
			if tt.msg != "" {
				require.Equal(t, tt.msg, msg)
			}
			if tt.id != "" && !strings.ContainsRune(tt.id, 0) {
				h.requireNothingRecorded(t, tt.id)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	h := setup(t)

	t.Run("secrets function", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		current := [][]byte{secretOld, secretNew}
		cfg := config()
		cfg.Secrets = nil
		cfg.SecretsFunc = func(context.Context) ([][]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			return current, nil
		}
		srv := server(t, h.e, h.op, cfg)

		// Both configured: a delivery signed with either is accepted, and so is
		// one that carries both signatures.
		for _, d := range []struct {
			id  string
			sig func(body []byte) string
		}{
			{"evt_rot_old", func(b []byte) string { return webhook.Sign(secretOld, clock, b) }},
			{"evt_rot_new", func(b []byte) string { return webhook.Sign(secretNew, clock, b) }},
			{"evt_rot_both", func(b []byte) string { return webhook.Sign(secretNew, clock, b) + "," + v1(secretOld, clock, b) }},
		} {
			body := event(d.id, 100)
			requireReceived(t, deliver(t, srv, body, d.sig(body)), false)
			require.Equal(t, 1, h.effects(t, d.id), d.id)
		}

		// The old one removed: refused, even for an event it signed before.
		mu.Lock()
		current = [][]byte{secretNew}
		mu.Unlock()
		body := event("evt_rot_late", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusBadRequest, a.status, a.raw)
		require.Equal(t, webhook.CodeInvalidSignature, a.code())
		h.requireNothingRecorded(t, "evt_rot_late")
		old := event("evt_rot_old", 100)
		a = deliver(t, srv, old, webhook.Sign(secretOld, clock, old))
		require.Equal(t, http.StatusBadRequest, a.status, a.raw)
		require.Equal(t, webhook.CodeInvalidSignature, a.code())

		requireReceived(t, deliver(t, srv, body, webhook.Sign(secretNew, clock, body)), false)
		requireReceived(t, deliver(t, srv, old, webhook.Sign(secretNew, clock, old)), true)
		require.Equal(t, 1, h.effects(t, "evt_rot_late"))
		require.Equal(t, 1, h.effects(t, "evt_rot_old"))
	})

	t.Run("static secrets", func(t *testing.T) {
		t.Parallel()
		both := server(t, h.e, h.op, config())
		cfg := config()
		cfg.Secrets = [][]byte{secretNew}
		newOnly := server(t, h.e, h.op, cfg)

		body := event("evt_static", 100)
		a := deliver(t, newOnly, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusBadRequest, a.status, a.raw)
		require.Equal(t, webhook.CodeInvalidSignature, a.code())
		h.requireNothingRecorded(t, "evt_static")
		requireReceived(t, deliver(t, both, body, webhook.Sign(secretOld, clock, body)), false)
		requireReceived(t, deliver(t, newOnly, body, webhook.Sign(secretNew, clock, body)), true)
		require.Equal(t, 1, h.effects(t, "evt_static"))
	})
}

// githubVerifier is a Verifier of another scheme, GitHub's: the hex
// HMAC-SHA256 of the body alone in X-Hub-Signature-256, "sha256=" first.
func githubVerifier(r *http.Request, body []byte, secrets [][]byte, _ time.Time) error {
	sig, ok := strings.CutPrefix(r.Header.Get("X-Hub-Signature-256"), "sha256=")
	got, err := hex.DecodeString(sig)
	if !ok || err != nil {
		return webhook.ErrMalformedSignature
	}
	for _, s := range secrets {
		mac := hmac.New(sha256.New, s)
		mac.Write(body)
		if hmac.Equal(mac.Sum(nil), got) {
			return nil
		}
	}
	return webhook.ErrSignatureMismatch
}

// githubEvent takes the event's id and type from GitHub's headers.
func githubEvent(r *http.Request, body []byte) (webhook.Event, payment, error) {
	var p payment
	if err := json.Unmarshal(body, &p); err != nil {
		return webhook.Event{}, p, errors.New("the body is not a JSON object")
	}
	p.ID, p.Type = r.Header.Get("X-GitHub-Delivery"), r.Header.Get("X-GitHub-Event")
	return webhook.Event{ID: p.ID, Type: p.Type}, p, nil
}

func githubSign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

func TestCustomVerifier(t *testing.T) {
	t.Parallel()
	h := setup(t)
	cfg := config()
	cfg.Verifier = webhook.VerifierFunc(githubVerifier)
	cfg.EventFunc = githubEvent
	srv := server(t, h.e, h.op, cfg)

	body := []byte(`{"action":"paid","amount":100}`)
	const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	delivery := []string{"X-GitHub-Delivery", id, "X-GitHub-Event", "payment"}

	a := deliver(t, srv, body, "", append(delivery, "X-Hub-Signature-256", githubSign([]byte("wrong"), body))...)
	require.Equal(t, http.StatusBadRequest, a.status, a.raw)
	require.Equal(t, webhook.CodeInvalidSignature, a.code())
	// The built-in scheme is not asked.
	a = deliver(t, srv, body, webhook.Sign(secretOld, clock, body), delivery...)
	require.Equal(t, http.StatusBadRequest, a.status, a.raw)
	require.Equal(t, webhook.CodeInvalidSignature, a.code())
	h.requireNothingRecorded(t, id)

	requireReceived(t, deliver(t, srv, body, "", append(delivery, "X-Hub-Signature-256", githubSign(secretOld, body))...), false)
	requireReceived(t, deliver(t, srv, body, "", append(delivery, "X-Hub-Signature-256", githubSign(secretNew, body))...), true)
	require.Equal(t, 1, h.effects(t, id))

	a = deliver(t, srv, body, "", "X-Hub-Signature-256", githubSign(secretOld, body))
	require.Equal(t, http.StatusBadRequest, a.status, a.raw)
	require.Equal(t, webhook.CodeInvalidEvent, a.code(), "no X-GitHub-Delivery: no id")
}

// heldOp is the payment operation with a second step, an external one, that
// waits for gate when the amount is 1.
func heldOp(t *testing.T, gate <-chan struct{}) *engine.Operation[payment, recorded, recorded] {
	return newPaymentOp(t, "held", engine.ExternalStep("hold", func(ctx context.Context, _ engine.Attempt, in payment, _ *recorded) error {
		if in.Amount == 1 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
}

func effectsPool(t *testing.T) *pgxpool.Pool {
	return idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, effectSchema)
		return err
	})
}

// TestNoWaitAndOverload: the first delivery is answered once its operation is
// reserved, not when it finishes; a process with no room answers 503
// overloaded, reserving nothing, and still answers a duplicate.
func TestNoWaitAndOverload(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	op := heldOp(t, gate)
	pool := effectsPool(t)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet, MaxInFlight: 1}, op)
	t.Cleanup(release) // before the engine stops
	h := &harness{pool: pool, e: e}
	cfg := config()
	cfg.RetryAfter = 2500 * time.Millisecond
	srv := server(t, e, op, cfg)

	held := event("evt_held", 1)
	requireReceived(t, deliver(t, srv, held, webhook.Sign(secretOld, clock, held)), false)
	info, err := e.GetByKey(context.Background(), scope, "evt_held")
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, info.Status, "answered while the operation waits")
	require.Equal(t, 1, h.effects(t, "evt_held"), "its first step committed with the reservation")

	other := event("evt_other", 2)
	a := deliver(t, srv, other, webhook.Sign(secretOld, clock, other))
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
	require.Equal(t, "overloaded", a.code())
	require.Equal(t, "3", a.header.Get("Retry-After"))
	h.requireNothingRecorded(t, "evt_other")

	requireReceived(t, deliver(t, srv, held, webhook.Sign(secretOld, clock, held)), true)

	release()
	require.Equal(t, engine.StatusSucceeded, waitFor(t, e, "evt_held").Status)
	// The first run gives its room back just after its waiters hear of it.
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(other))
		req.Header.Set(webhook.DefaultHeader, webhook.Sign(secretOld, clock, other))
		resp, err := srv.Client().Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, h.effects(t, "evt_other"))
	require.Equal(t, 1, h.effects(t, "evt_held"))
}

// TestScopeBusy: a provider over its share (engine.Config.MaxInFlightPerScope)
// is answered 429 too_many_requests with Retry-After, reserving nothing, not
// 500; the event is carried out when delivered again later.
func TestScopeBusy(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	op := heldOp(t, gate)
	pool := effectsPool(t)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet, MaxInFlightPerScope: 1}, op)
	t.Cleanup(release) // before the engine stops
	h := &harness{pool: pool, e: e}
	cfg := config()
	cfg.RetryAfter = 2500 * time.Millisecond
	srv := server(t, e, op, cfg)

	held := event("evt_held", 1)
	requireReceived(t, deliver(t, srv, held, webhook.Sign(secretOld, clock, held)), false)
	other := event("evt_other", 2)
	a := deliver(t, srv, other, webhook.Sign(secretOld, clock, other))
	require.Equal(t, http.StatusTooManyRequests, a.status, a.raw)
	require.Equal(t, "too_many_requests", a.code())
	require.Equal(t, "3", a.header.Get("Retry-After"))
	h.requireNothingRecorded(t, "evt_other")

	release()
	require.Equal(t, engine.StatusSucceeded, waitFor(t, e, "evt_held").Status)
	require.Eventually(t, func() bool {
		return deliver(t, srv, other, webhook.Sign(secretOld, clock, other)).status == http.StatusOK
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, h.effects(t, "evt_other"))
}

// TestWait: with Config.Wait, the first delivery is answered once the
// operation has finished.
func TestWait(t *testing.T) {
	t.Parallel()
	op := heldOp(t, nil)
	pool := effectsPool(t)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, op)
	cfg := config()
	cfg.Wait = time.Minute
	srv := server(t, e, op, cfg)

	body := event("evt_waited", 2)
	requireReceived(t, deliver(t, srv, body, webhook.Sign(secretOld, clock, body)), false)
	info, err := e.GetByKey(context.Background(), scope, "evt_waited")
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	requireReceived(t, deliver(t, srv, body, webhook.Sign(secretOld, clock, body)), true)
}

func TestUnavailable(t *testing.T) {
	t.Parallel()

	t.Run("database", func(t *testing.T) {
		t.Parallel()
		// Nothing listens on port 1: every connection is refused.
		pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		op := newPaymentOp(t, "payment")
		// The failures are the test's: their logs are not shown.
		silent := slog.New(slog.DiscardHandler)
		e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: silent})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Stop(context.Background()) })
		cfg := config()
		cfg.Logger = silent
		srv := server(t, e, op, cfg)
		body := event("evt_nodb", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
		require.Equal(t, "service_unavailable", a.code())
		require.Equal(t, "1", a.header.Get("Retry-After"))
	})

	t.Run("engine stopped", func(t *testing.T) {
		t.Parallel()
		pool := effectsPool(t)
		op := newPaymentOp(t, "payment")
		e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: quiet})
		require.NoError(t, err)
		require.NoError(t, e.Stop(context.Background()))
		srv := server(t, e, op, config())
		body := event("evt_stopped", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
		require.Equal(t, "service_unavailable", a.code())
		require.NotEmpty(t, a.header.Get("Retry-After"))
	})

	t.Run("secrets", func(t *testing.T) {
		t.Parallel()
		h := setup(t)
		for name, f := range map[string]func(context.Context) ([][]byte, error){
			"error": func(context.Context) ([][]byte, error) { return nil, errors.New("the vault is sealed") },
			"none":  func(context.Context) ([][]byte, error) { return nil, nil },
			"empty": func(context.Context) ([][]byte, error) { return [][]byte{{}}, nil },
		} {
			cfg := config()
			cfg.Secrets = nil
			cfg.SecretsFunc = f
			cfg.Logger = slog.New(slog.DiscardHandler)
			srv := server(t, h.e, h.op, cfg)
			body := event("evt_secrets", 100)
			a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
			require.Equal(t, http.StatusServiceUnavailable, a.status, "%s: %s", name, a.raw)
			require.Equal(t, "service_unavailable", a.code(), name)
			require.NotContains(t, a.raw, "vault", "the cause is for the log")
		}
		h.requireNothingRecorded(t, "evt_secrets")
	})
}

func TestHandlerConfig(t *testing.T) {
	t.Parallel()
	// No database: Handler only checks its configuration.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	op := newPaymentOp(t, "payment")
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	secrets := func(context.Context) ([][]byte, error) { return nil, nil }

	tests := []struct {
		name   string
		change func(c *webhook.Config[payment])
		want   string // "" for a valid config
	}{
		{name: "valid", change: func(*webhook.Config[payment]) {}},
		{name: "secrets function", change: func(c *webhook.Config[payment]) { c.Secrets, c.SecretsFunc = nil, secrets }},
		{name: "verifier without secrets", change: func(c *webhook.Config[payment]) { c.Secrets, c.Verifier = nil, webhook.VerifierFunc(githubVerifier) }},
		{name: "header and tolerance", change: func(c *webhook.Config[payment]) { c.Header, c.Tolerance = "Stripe-Signature", time.Minute }},
		{name: "no scope", change: func(c *webhook.Config[payment]) { c.Scope = "" }, want: "a scope is required"},
		{name: "scope with a NUL", change: func(c *webhook.Config[payment]) { c.Scope = "a\x00" }, want: "scope"},
		{name: "no secrets", change: func(c *webhook.Config[payment]) { c.Secrets = nil }, want: "secrets are required"},
		{name: "an empty secret", change: func(c *webhook.Config[payment]) { c.Secrets = [][]byte{secretOld, nil} }, want: "a secret is empty"},
		{name: "secrets twice", change: func(c *webhook.Config[payment]) { c.SecretsFunc = secrets }, want: "exclusive"},
		{name: "header beside a verifier", change: func(c *webhook.Config[payment]) {
			c.Verifier, c.Header = webhook.VerifierFunc(githubVerifier), "X-Hub-Signature-256"
		}, want: "built-in verifier"},
		{name: "tolerance beside a verifier", change: func(c *webhook.Config[payment]) {
			c.Verifier, c.Tolerance = webhook.VerifierFunc(githubVerifier), time.Minute
		}, want: "built-in verifier"},
		{name: "negative", change: func(c *webhook.Config[payment]) { c.MaxBodyBytes = -1 }, want: "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := config()
			tt.change(cfg)
			h, err := webhook.Handler(e, op, cfg)
			if tt.want == "" {
				require.NoError(t, err)
				require.NotNil(t, h)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}

	_, err = webhook.Handler(e, op, nil)
	require.Error(t, err)
	_, err = webhook.Handler(e, newPaymentOp(t, "other"), config())
	require.ErrorContains(t, err, "operation type not registered")
}
