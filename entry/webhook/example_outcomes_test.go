package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/reconcile"
)

type refundRequest struct {
	Amount int64 `json:"amount"`
}

type refundResult struct {
	ProviderRefundID string `json:"providerRefundId"`
}

// Settle a call with the provider's webhook: the provider accepts a refund as
// pending and tells its outcome later, by an event; the endpoint records the
// event in the engine's inbox, and the step that waits for it goes forward.
func ExampleOutcomes() {
	ctx := context.Background()
	// A migrated database, as a service has after engine.Migrate at start.
	pool, dropDB := idemflowtest.ExamplePool("example_outcomes")
	defer dropDB()
	if _, err := pool.Exec(ctx, `CREATE TABLE provider_event (event_id text PRIMARY KEY)`); err != nil {
		panic(err)
	}

	// The provider's side: it is asked under the step's derived key, and
	// answers "pending" under its own refund id.
	asked := make(chan string, 1)
	op, err := engine.NewOperation("refund", []engine.Step[refundRequest, refundResult]{
		engine.ExternalStep("provider", func(_ context.Context, at engine.Attempt, _ refundRequest, _ *refundResult) error {
			select {
			case asked <- at.Key:
			default:
			}
			return engine.Accepted("pr_1", "the provider accepted the refund")
		}).
			Lookup(func(context.Context, engine.Attempt, refundRequest, *refundResult) (bool, error) {
				return false, engine.Accepted("", "the provider is still processing the refund")
			}).
			FromReference(func(_ refundRequest, s *refundResult, ref string) error { s.ProviderRefundID = ref; return nil }).
			Compare(func(in refundRequest, rec reconcile.Record) reconcile.Kind {
				if rec.Amount != in.Amount {
					return reconcile.AmountDiffers
				}
				return ""
			}),
	}, func(_ refundRequest, s *refundResult) (refundResult, error) { return *s, nil }, nil)
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: quiet})
	if err != nil {
		panic(err)
	}
	if err := e.StartWorkers(ctx); err != nil { // the waiting step is run again by a River job
		panic(err)
	}
	defer e.Stop(ctx)

	secret := []byte("whsec_example")
	h, err := webhook.Outcomes(e, &webhook.OutcomeConfig{
		Secrets: [][]byte{secret},
		// The provider's event, in the engine's terms.
		OutcomeFunc: func(_ *http.Request, body []byte) (engine.Outcome, error) {
			var ev struct {
				ID   string `json:"id"`
				Type string `json:"type"`
				Data struct {
					IdempotencyKey string `json:"idempotencyKey"`
					RefundID       string `json:"refundId"`
					Amount         int64  `json:"amount"`
				} `json:"data"`
			}
			if err := json.Unmarshal(body, &ev); err != nil {
				return engine.Outcome{}, errors.New("the body is not a refund event")
			}
			o := engine.Outcome{EventID: ev.ID, Record: reconcile.Record{
				Key: ev.Data.IdempotencyKey, Reference: ev.Data.RefundID, Amount: ev.Data.Amount,
			}}
			switch ev.Type {
			case "refund.succeeded":
				o.Record.Status = reconcile.Succeeded
			case "refund.failed":
				o.Record.Status, o.Failure = reconcile.Failed, engine.Fail("refund_failed", "the provider could not refund")
			default:
				return o, webhook.ErrIgnore
			}
			return o, nil
		},
		// The service's own record of the event, in the same commit.
		TxFunc: func(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error {
			if !added {
				return nil // a delivery again: recorded the first time
			}
			_, err := tx.Exec(ctx, `INSERT INTO provider_event (event_id) VALUES ($1)`, o.EventID)
			return err
		},
		Logger: quiet,
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/provider", h)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	deliver := func(body []byte, sig string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/provider", bytes.NewReader(body))
		req.Header.Set("Provider-Signature", sig)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(answer))
	}

	s, err := engine.Start(ctx, e, op, "shop", "refund-1", refundRequest{Amount: 1499}, nil)
	if err != nil {
		panic(err)
	}
	key := <-asked // the provider has the request; its event names the key
	event := func(amount int64) []byte {
		return fmt.Appendf(nil, `{"id":"evt_1","type":"refund.succeeded","data":{"idempotencyKey":%q,"refundId":"pr_1","amount":%d}}`, key, amount)
	}
	deliver(event(1499), webhook.Sign(secret, time.Now(), event(1499)))
	deliver(event(1499), webhook.Sign(secret, time.Now(), event(1499))) // the provider retries
	deliver(event(1499), webhook.Sign([]byte("whsec_guess"), time.Now(), event(1499)))
	deliver(event(1), webhook.Sign(secret, time.Now(), event(1)))

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := s.Wait(wctx)
	if err != nil {
		panic(err)
	}
	out, err := op.Result(info)
	if err != nil {
		panic(err)
	}
	full, err := e.Get(ctx, s.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(info.Status, out.ProviderRefundID, "resolved by", full.Steps[0].ResolvedBy)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM provider_event`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println(n, "event recorded")
	// Output:
	// 200 {"received":true}
	// 200 {"received":true,"duplicate":true}
	// 400 {"error":{"code":"invalid_signature","message":"no signature matches the body"}}
	// 422 {"error":{"code":"idempotency_key_reused","message":"this event id was delivered before with a different outcome","mismatchedFields":["amount"]}}
	// succeeded pr_1 resolved by event
	// 1 event recorded
}
