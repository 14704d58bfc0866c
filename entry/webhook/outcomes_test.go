package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/reconcile"
)

// The outcomes tests' operation is a refund whose one step calls a provider
// that accepts every refund as pending, under a reference of its own, and
// tells the outcome by webhook alone: the step has no lookup, so only an event
// settles it.

type refundIn struct {
	Amount int64 `json:"amount"`
}

type refundState struct {
	Ref string `json:"ref"`
}

// providerRef is the provider's id of the refund asked under key.
func providerRef(key string) string { return "pr_" + key[max(0, len(key)-12):] }

func newRefundOp(t *testing.T) *engine.Operation[refundIn, refundState, string] {
	t.Helper()
	op, err := engine.NewOperation("refund", []engine.Step[refundIn, refundState]{
		engine.ExternalStep("provider", func(_ context.Context, at engine.Attempt, _ refundIn, _ *refundState) error {
			return engine.Accepted(providerRef(at.Key), "the provider accepted the refund; final status later")
		}).Window(time.Hour).
			FromReference(func(_ refundIn, s *refundState, ref string) error { s.Ref = ref; return nil }).
			Compare(func(in refundIn, rec reconcile.Record) reconcile.Kind {
				if rec.Amount != in.Amount {
					return reconcile.AmountDiffers
				}
				return ""
			}),
	}, func(_ refundIn, s *refundState) (string, error) { return s.Ref, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}})
	require.NoError(t, err)
	return op
}

// refundEvent is the body of the provider's event about the refund asked
// under key.
func refundEvent(id, typ, key string, amount int64) []byte {
	ref := ""
	if key != "" {
		ref = providerRef(key)
	}
	return fmt.Appendf(nil, `{"id":%q,"type":%q,"data":{"idempotencyKey":%q,"refundId":%q,"amount":%d}}`, id, typ, key, ref, amount)
}

// refundOutcome is the tests' OutcomeFunc: the provider's refund events, in
// the engine's terms.
func refundOutcome(_ *http.Request, body []byte) (engine.Outcome, error) {
	var ev struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			Key      string `json:"idempotencyKey"`
			RefundID string `json:"refundId"`
			Amount   int64  `json:"amount"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		return engine.Outcome{}, errors.New("the body is not a refund event")
	}
	o := engine.Outcome{EventID: ev.ID, Record: reconcile.Record{Key: ev.Data.Key, Reference: ev.Data.RefundID, Amount: ev.Data.Amount}}
	switch ev.Type {
	case "refund.succeeded":
		o.Record.Status = reconcile.Succeeded
	case "refund.failed":
		o.Record.Status, o.Failure = reconcile.Failed, engine.Fail("refund_failed", "the provider could not refund")
	default:
		return o, webhook.ErrIgnore
	}
	return o, nil
}

// The application's own record of the events, which TxFunc writes.
const eventSchema = `CREATE TABLE webhook_event (id bigserial PRIMARY KEY, event_id text NOT NULL, added boolean NOT NULL)`

// recordEvent is the tests' TxFunc.
func recordEvent(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error {
	_, err := tx.Exec(ctx, `INSERT INTO webhook_event (event_id, added) VALUES ($1, $2)`, o.EventID, added)
	return err
}

// outcomeHarness is one database with the event table, an engine running the
// refund operation, and an outcomes endpoint with TxFunc recordEvent.
type outcomeHarness struct {
	pool *pgxpool.Pool
	e    *engine.Engine
	op   *engine.Operation[refundIn, refundState, string]
	srv  *httptest.Server
}

func setupOutcomes(t *testing.T) *outcomeHarness {
	t.Helper()
	pool := idemflowtest.Pool(t, func(ctx context.Context, pool *pgxpool.Pool) error {
		_, err := pool.Exec(ctx, eventSchema)
		return err
	})
	op := newRefundOp(t)
	e := idemflowtest.Engine(t, pool, &engine.Config{Logger: quiet}, op)
	h := &outcomeHarness{pool: pool, e: e, op: op}
	h.srv = outcomesServer(t, e, outcomeConfig())
	return h
}

// outcomeConfig is the outcomes tests' base configuration.
func outcomeConfig() *webhook.OutcomeConfig {
	return &webhook.OutcomeConfig{
		OutcomeFunc: refundOutcome,
		TxFunc:      recordEvent,
		Secrets:     [][]byte{secretOld, secretNew},
		Logger:      quiet,
		Test:        webhook.TestConfig{NowFunc: func() time.Time { return clock }},
	}
}

func outcomesServer(t *testing.T, e *engine.Engine, cfg *webhook.OutcomeConfig) *httptest.Server {
	t.Helper()
	h, err := webhook.Outcomes(e, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// startWaiting starts a refund under key and returns it once its provider
// step waits for its outcome, with its derived key.
func (h *outcomeHarness) startWaiting(t *testing.T, key string, amount int64) (*engine.Started, string) {
	t.Helper()
	s, err := engine.Start(context.Background(), h.e, h.op, "shop", key, refundIn{Amount: amount}, nil)
	require.NoError(t, err)
	var derived string
	require.Eventually(t, func() bool {
		info, err := h.e.Get(context.Background(), s.ID)
		require.NoError(t, err)
		derived = info.Steps[0].DerivedKey
		return info.Steps[0].Status == engine.StepStatusWaiting
	}, 30*time.Second, 10*time.Millisecond, "the provider step waits")
	return s, derived
}

// inbox counts what the engine's inbox and the event table hold for the
// event id: outcomes kept, rows TxFunc wrote, and those of them written with
// added.
func (h *outcomeHarness) inbox(t *testing.T, eventID string) (kept, rows, added int) {
	t.Helper()
	require.NoError(t, h.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM idemflow_outcome WHERE event_id = $1),
		(SELECT count(*) FROM webhook_event WHERE event_id = $1),
		(SELECT count(*) FROM webhook_event WHERE event_id = $1 AND added)`, eventID).Scan(&kept, &rows, &added))
	return kept, rows, added
}

// requireStored requires the answer 200 {"received":true}, or with
// "duplicate":true.
func requireStored(t *testing.T, a answer, duplicate bool) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.raw)
	want := `{"received":true}`
	if duplicate {
		want = `{"received":true,"duplicate":true}`
	}
	require.Equal(t, want, a.raw)
}

func waitStarted(t *testing.T, s *engine.Started) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	return info
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	h := setupOutcomes(t)

	t.Run("settles a waiting step", func(t *testing.T) {
		t.Parallel()
		s, key := h.startWaiting(t, "order-settle", 1500)
		body := refundEvent("evt_settle", "refund.succeeded", key, 1500)
		requireStored(t, deliver(t, h.srv, body, webhook.Sign(secretOld, clock, body)), false)

		info := waitStarted(t, s)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := h.op.Result(info)
		require.NoError(t, err)
		require.Equal(t, providerRef(key), out)
		full, err := h.e.Get(context.Background(), s.ID)
		require.NoError(t, err)
		require.Equal(t, engine.ResolvedByEvent, full.Steps[0].ResolvedBy)
		kept, rows, added := h.inbox(t, "evt_settle")
		require.Equal(t, []int{1, 1, 1}, []int{kept, rows, added}, "the outcome and TxFunc's row, committed together")

		// Delivered again, later, with the other secret: kept once; TxFunc
		// is told.
		requireStored(t, deliver(t, h.srv, body, webhook.Sign(secretNew, clock.Add(time.Minute), body)), true)
		kept, rows, added = h.inbox(t, "evt_settle")
		require.Equal(t, []int{1, 2, 1}, []int{kept, rows, added})
	})

	t.Run("failure", func(t *testing.T) {
		t.Parallel()
		s, key := h.startWaiting(t, "order-failed", 700)
		body := refundEvent("evt_failed", "refund.failed", key, 700)
		requireStored(t, deliver(t, h.srv, body, webhook.Sign(secretOld, clock, body)), false)
		info := waitStarted(t, s)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "refund_failed", info.Error.Code)
	})

	t.Run("before any step waits", func(t *testing.T) {
		t.Parallel()
		// The event may come first, for a call on its way or none that this
		// service knows: it is kept, for the step that holds the key
		// whenever it waits.
		body := refundEvent("evt_early", "refund.succeeded", "idf3_nobody_asked_this_yet", 100)
		requireStored(t, deliver(t, h.srv, body, webhook.Sign(secretOld, clock, body)), false)
		kept, rows, added := h.inbox(t, "evt_early")
		require.Equal(t, []int{1, 1, 1}, []int{kept, rows, added})
	})

	t.Run("concurrent deliveries", func(t *testing.T) {
		t.Parallel()
		const n = 10
		body := refundEvent("evt_concurrent", "refund.succeeded", "idf3_concurrent_deliveries", 100)
		answers := make([]answer, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				answers[i] = deliver(t, h.srv, body, webhook.Sign(secretOld, clock.Add(time.Duration(i)*time.Second), body))
			})
		}
		close(start)
		wg.Wait()
		firsts := 0
		for _, a := range answers {
			require.Equal(t, http.StatusOK, a.status, a.raw)
			if a.body["duplicate"] == nil {
				firsts++
			}
		}
		require.Equal(t, 1, firsts, "exactly one delivery without duplicate")
		kept, rows, added := h.inbox(t, "evt_concurrent")
		require.Equal(t, []int{1, n, 1}, []int{kept, rows, added})
	})

	t.Run("another outcome under the same id", func(t *testing.T) {
		t.Parallel()
		s, key := h.startWaiting(t, "order-reused", 300)
		first := refundEvent("evt_reused", "refund.succeeded", key, 300)
		requireStored(t, deliver(t, h.srv, first, webhook.Sign(secretOld, clock, first)), false)
		for other, fields := range map[string][]any{
			string(refundEvent("evt_reused", "refund.succeeded", key, 999)): {"amount"},
			string(refundEvent("evt_reused", "refund.failed", key, 300)):    {"failure", "status"},
		} {
			a := deliver(t, h.srv, []byte(other), webhook.Sign(secretOld, clock, []byte(other)))
			require.Equal(t, http.StatusUnprocessableEntity, a.status, a.raw)
			require.Equal(t, "idempotency_key_reused", a.code())
			e := a.body["error"].(map[string]any)
			require.Equal(t, "this event id was delivered before with a different outcome", e["message"])
			require.Equal(t, fields, e["mismatchedFields"], a.raw)
		}
		kept, rows, added := h.inbox(t, "evt_reused")
		require.Equal(t, []int{1, 1, 1}, []int{kept, rows, added}, "nothing of the refused deliveries committed")
		require.Equal(t, engine.StatusSucceeded, waitStarted(t, s).Status, "the first outcome stands")
	})

	t.Run("ignored", func(t *testing.T) {
		t.Parallel()
		body := refundEvent("evt_ignored", "refund.updated", "idf3_ignored", 100)
		a := deliver(t, h.srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, `{"received":true,"ignored":true}`, a.raw)
		kept, rows, _ := h.inbox(t, "evt_ignored")
		require.Equal(t, []int{0, 0}, []int{kept, rows})
	})

	// Refusals: nothing is recorded.
	refusals := []struct {
		name string
		id   string
		body []byte // defaults to a refund.succeeded event of id
		sig  func(body []byte) string
		code string
		msg  string
	}{
		{name: "missing signature", id: "evt_r_missing", sig: func([]byte) string { return "" },
			code: webhook.CodeInvalidSignature, msg: "no signature header: Provider-Signature"},
		{name: "bad signature", id: "evt_r_bad", sig: func(b []byte) string { return webhook.Sign([]byte("whsec_guess"), clock, b) },
			code: webhook.CodeInvalidSignature, msg: "no signature matches the body"},
		{name: "old timestamp", id: "evt_r_old", sig: func(b []byte) string { return webhook.Sign(secretOld, clock.Add(-6*time.Minute), b) },
			code: webhook.CodeInvalidSignature},
		{name: "not an event", id: "evt_r_json", body: []byte(`id=evt_r_json`), code: webhook.CodeInvalidEvent,
			msg: "the body is not a refund event"},
		{name: "no id", body: refundEvent("", "refund.succeeded", "idf3_k", 1), code: webhook.CodeInvalidEvent,
			msg: "the event has no id"},
		{name: "no key", id: "evt_r_nokey", body: refundEvent("evt_r_nokey", "refund.succeeded", "", 1), code: webhook.CodeInvalidEvent,
			msg: "the event names no key"},
		{name: "key with a NUL", id: "evt_r_nul", body: []byte(`{"id":"evt_r_nul","type":"refund.succeeded","data":{"idempotencyKey":"k\u0000"}}`),
			code: webhook.CodeInvalidEvent, msg: "the key it names has a control character"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			body := tt.body
			if body == nil {
				body = refundEvent(tt.id, "refund.succeeded", "idf3_refused", 100)
			}
			sig := webhook.Sign(secretOld, clock, body)
			if tt.sig != nil {
				sig = tt.sig(body)
			}
			a := deliver(t, h.srv, body, sig)
			require.Equal(t, http.StatusBadRequest, a.status, a.raw)
			require.Equal(t, tt.code, a.code(), a.raw)
			if tt.msg != "" {
				require.Equal(t, tt.msg, a.body["error"].(map[string]any)["message"])
			}
			if tt.id != "" {
				kept, rows, _ := h.inbox(t, tt.id)
				require.Equal(t, []int{0, 0}, []int{kept, rows})
			}
		})
	}
}

// TestOutcomesNotStored: an outcome that does not commit is answered 5xx,
// so that the provider delivers it again, and nothing of it is kept.
func TestOutcomesNotStored(t *testing.T) {
	t.Parallel()
	h := setupOutcomes(t)
	// silent keeps the failures the tests cause out of the output.
	silent := slog.New(slog.DiscardHandler)

	t.Run("TxFunc fails", func(t *testing.T) {
		t.Parallel()
		cfg := outcomeConfig()
		cfg.Logger = silent
		cfg.TxFunc = func(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error {
			if err := recordEvent(ctx, tx, o, added); err != nil {
				return err
			}
			return errors.New("the ledger is closed")
		}
		srv := outcomesServer(t, h.e, cfg)
		body := refundEvent("evt_txfunc", "refund.succeeded", "idf3_txfunc", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusInternalServerError, a.status, a.raw)
		require.Equal(t, "internal_error", a.code())
		require.NotContains(t, a.raw, "ledger", "the cause is for the log")
		kept, rows, _ := h.inbox(t, "evt_txfunc")
		require.Equal(t, []int{0, 0}, []int{kept, rows})

		// The provider delivers it again, to a service that can take it now.
		requireStored(t, deliver(t, h.srv, body, webhook.Sign(secretOld, clock, body)), false)
	})

	t.Run("TxFunc refuses a reused id", func(t *testing.T) {
		t.Parallel()
		cfg := outcomeConfig()
		cfg.Logger = silent
		cfg.TxFunc = func(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error {
			if err := recordEvent(ctx, tx, o, added); err != nil {
				return err
			}
			return &engine.ReusedError{What: "event", ID: o.EventID, Fields: []string{"data"}}
		}
		srv := outcomesServer(t, h.e, cfg)
		body := refundEvent("evt_txreused", "refund.succeeded", "idf3_txreused", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusUnprocessableEntity, a.status, a.raw)
		require.Equal(t, "idempotency_key_reused", a.code())
		require.Equal(t, []any{"data"}, a.body["error"].(map[string]any)["mismatchedFields"], a.raw)
		kept, rows, _ := h.inbox(t, "evt_txreused")
		require.Equal(t, []int{0, 0}, []int{kept, rows}, "nothing of the refused delivery is kept")
	})

	// A delivery that waits out lock_timeout on its key, which another
	// delivery of the event holds (here, a transaction that holds the key's
	// lock a while), is tried again: 200 once the key is free.
	t.Run("lock wait tried again", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pc := h.pool.Config().Copy()
		pc.ConnConfig.RuntimeParams["lock_timeout"] = "50ms"
		short, err := pgxpool.NewWithConfig(ctx, pc)
		require.NoError(t, err)
		t.Cleanup(short.Close)
		// An engine of its own on that pool: the endpoint records on its
		// engine's pool. No workers: recording needs none.
		e, err := engine.New(short, &engine.Config{Operations: []engine.Definition{newRefundOp(t)}, Logger: quiet})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Stop(context.Background()) })
		srv := outcomesServer(t, e, outcomeConfig())

		holder, err := h.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
		_, err = holder.Exec(ctx, `SELECT idemflow_outcome_lock('idf3_locked')`)
		require.NoError(t, err)
		body := refundEvent("evt_locked", "refund.succeeded", "idf3_locked", 100)
		answered := make(chan answer, 1)
		go func() { answered <- deliver(t, srv, body, webhook.Sign(secretOld, clock, body)) }()
		time.Sleep(300 * time.Millisecond) // several lock_timeouts
		require.NoError(t, holder.Rollback(ctx))
		requireStored(t, <-answered, false)
		kept, rows, added := h.inbox(t, "evt_locked")
		require.Equal(t, []int{1, 1, 1}, []int{kept, rows, added})
	})

	t.Run("TxFunc times out", func(t *testing.T) {
		t.Parallel()
		cfg := outcomeConfig()
		cfg.Logger = silent
		cfg.RecordTimeout = 200 * time.Millisecond
		cfg.RetryAfter = 2500 * time.Millisecond
		cfg.TxFunc = func(ctx context.Context, tx pgx.Tx, _ engine.Outcome, _ bool) error {
			// A statement that outlasts RecordTimeout: a database that does not
			// answer.
			_, err := tx.Exec(ctx, `SELECT pg_sleep(10)`)
			return err
		}
		srv := outcomesServer(t, h.e, cfg)
		body := refundEvent("evt_slow", "refund.succeeded", "idf3_slow", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
		require.Equal(t, "service_unavailable", a.code())
		require.Equal(t, "3", a.header.Get("Retry-After"))
		kept, _, _ := h.inbox(t, "evt_slow")
		require.Zero(t, kept)
	})

	t.Run("commit fails", func(t *testing.T) {
		t.Parallel()
		_, err := h.pool.Exec(context.Background(),
			`CREATE TABLE webhook_deferred (event_id text CONSTRAINT webhook_deferred_once UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
		require.NoError(t, err)
		cfg := outcomeConfig()
		cfg.Logger = silent
		cfg.TxFunc = func(ctx context.Context, tx pgx.Tx, o engine.Outcome, _ bool) error {
			// Checked at COMMIT, which fails.
			_, err := tx.Exec(ctx, `INSERT INTO webhook_deferred VALUES ($1), ($1)`, o.EventID)
			return err
		}
		srv := outcomesServer(t, h.e, cfg)
		body := refundEvent("evt_commit", "refund.succeeded", "idf3_commit", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
		require.Equal(t, "service_unavailable", a.code())
		require.Equal(t, "1", a.header.Get("Retry-After"))
		kept, _, _ := h.inbox(t, "evt_commit")
		require.Zero(t, kept)
	})

	t.Run("database", func(t *testing.T) {
		t.Parallel()
		// Nothing listens on port 1: every connection is refused.
		pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{newRefundOp(t)}, Logger: silent})
		require.NoError(t, err)
		t.Cleanup(func() { _ = e.Stop(context.Background()) })
		cfg := outcomeConfig()
		cfg.Logger = silent
		srv := outcomesServer(t, e, cfg)
		body := refundEvent("evt_nodb", "refund.succeeded", "idf3_nodb", 100)
		a := deliver(t, srv, body, webhook.Sign(secretOld, clock, body))
		require.Equal(t, http.StatusServiceUnavailable, a.status, a.raw)
		require.Equal(t, "service_unavailable", a.code())
		require.Equal(t, "1", a.header.Get("Retry-After"))
	})
}

func TestOutcomesConfig(t *testing.T) {
	t.Parallel()
	// No database: Outcomes only checks its configuration.
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{newRefundOp(t)}, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	secrets := func(context.Context) ([][]byte, error) { return nil, nil }

	tests := []struct {
		name   string
		change func(c *webhook.OutcomeConfig)
		want   string // "" for a valid config
	}{
		{name: "valid", change: func(*webhook.OutcomeConfig) {}},
		{name: "no TxFunc", change: func(c *webhook.OutcomeConfig) { c.TxFunc = nil }},
		{name: "secrets function", change: func(c *webhook.OutcomeConfig) { c.Secrets, c.SecretsFunc = nil, secrets }},
		{name: "verifier without secrets", change: func(c *webhook.OutcomeConfig) { c.Secrets, c.Verifier = nil, webhook.VerifierFunc(githubVerifier) }},
		{name: "no outcome function", change: func(c *webhook.OutcomeConfig) { c.OutcomeFunc = nil }, want: "an outcome function is required"},
		{name: "no secrets", change: func(c *webhook.OutcomeConfig) { c.Secrets = nil }, want: "secrets are required"},
		{name: "an empty secret", change: func(c *webhook.OutcomeConfig) { c.Secrets = [][]byte{secretOld, nil} }, want: "a secret is empty"},
		{name: "secrets twice", change: func(c *webhook.OutcomeConfig) { c.SecretsFunc = secrets }, want: "exclusive"},
		{name: "header beside a verifier", change: func(c *webhook.OutcomeConfig) {
			c.Verifier, c.Header = webhook.VerifierFunc(githubVerifier), "X-Hub-Signature-256"
		}, want: "built-in verifier"},
		{name: "negative", change: func(c *webhook.OutcomeConfig) { c.RecordTimeout = -1 }, want: "negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := outcomeConfig()
			tt.change(cfg)
			h, err := webhook.Outcomes(e, cfg)
			if tt.want == "" {
				require.NoError(t, err)
				require.NotNil(t, h)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}

	_, err = webhook.Outcomes(e, nil)
	require.ErrorContains(t, err, "a config is required")
	_, err = webhook.Outcomes(nil, outcomeConfig())
	require.ErrorContains(t, err, "an engine is required")
}
