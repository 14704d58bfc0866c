package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A sender signs a body; the built-in verifier checks it, and refuses it once
// the body is changed or the signature is older than the tolerance.
func ExampleSign() {
	secret := []byte("whsec_example")
	body := []byte(`{"id":"evt_1","type":"payment.succeeded","amount":1499}`)
	signedAt := time.Unix(1_700_000_000, 0)
	sig := webhook.Sign(secret, signedAt, body)
	fmt.Println(sig)

	v := webhook.SignatureVerifier{} // Provider-Signature, 5 minutes
	check := func(body []byte, now time.Time) {
		r := httptest.NewRequest(http.MethodPost, "/webhooks/provider", bytes.NewReader(body))
		r.Header.Set(webhook.DefaultHeader, sig)
		if err := v.Verify(r, body, [][]byte{[]byte("whsec_previous"), secret}, now); err != nil {
			fmt.Println("refused:", err)
			return
		}
		fmt.Println("verified")
	}
	check(body, signedAt.Add(time.Minute))
	check(bytes.Replace(body, []byte("1499"), []byte("9999"), 1), signedAt.Add(time.Minute))
	check(body, signedAt.Add(time.Hour))
	// Output:
	// t=1700000000,v1=7ba6fbbe0bbf311d25431bfe1d26233e7812cfdbe94f027f836eb08bdeb3eb18
	// verified
	// refused: no signature matches the body
	// refused: the signature's timestamp is outside the tolerance: signed at 2023-11-14T22:13:20Z, 1h0m0s ago (tolerance 5m0s)
}

type paymentEvent struct {
	ID     string `json:"id"`
	Type   string `json:"type"`
	Amount int64  `json:"amount"`
}

type paymentState struct {
	Recorded bool `json:"recorded"`
}

// Mount an operation as a webhook endpoint: the provider's deliveries of one
// event, however many, run it once.
func ExampleHandler() {
	ctx := context.Background()
	// A migrated database, as a service has after engine.Migrate at start.
	pool, dropDB := idemflowtest.ExamplePool("example_webhook")
	defer dropDB()
	if _, err := pool.Exec(ctx, `CREATE TABLE payment (event_id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		panic(err)
	}

	op, err := engine.NewOperation("payment_received", []engine.Step[paymentEvent, paymentState]{
		engine.TxStep("record", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in paymentEvent, s *paymentState) error {
			_, err := tx.Exec(ctx, `INSERT INTO payment (event_id, amount) VALUES ($1, $2)`, in.ID, in.Amount)
			s.Recorded = true
			return err
		}),
	}, func(_ paymentEvent, s *paymentState) (paymentState, error) { return *s, nil },
		// Longer than the provider retries a delivery: the event's id stays taken.
		&engine.OperationOpts{Retention: 7 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: quiet})
	if err != nil {
		panic(err)
	}
	if err := e.StartWorkers(ctx); err != nil { // retries and resumes
		panic(err)
	}
	defer e.Stop(ctx)

	secret := []byte("whsec_example")
	h, err := webhook.Handler(e, op, &webhook.Config[paymentEvent]{
		Scope:   "webhook:provider",
		Secrets: [][]byte{secret},
		Logger:  quiet,
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
	body := []byte(`{"id":"evt_1","type":"payment.succeeded","amount":1499}`)
	deliver(body, webhook.Sign(secret, time.Now(), body))
	deliver(body, webhook.Sign(secret, time.Now(), body)) // the provider retries
	deliver(body, webhook.Sign([]byte("whsec_guess"), time.Now(), body))
	other := []byte(`{"id":"evt_1","type":"payment.succeeded","amount":1}`)
	deliver(other, webhook.Sign(secret, time.Now(), other))

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println(n, "payment recorded")
	// Output:
	// 200 {"received":true}
	// 200 {"received":true,"duplicate":true}
	// 400 {"error":{"code":"invalid_signature","message":"no signature matches the body"}}
	// 422 {"error":{"code":"idempotency_key_reused","message":"this event id was delivered before with a different event","mismatchedFields":["amount"]}}
	// 1 payment recorded
}

// Another provider's scheme: GitHub signs the body alone, with no timestamp,
// in X-Hub-Signature-256.
func ExampleVerifierFunc() {
	github := webhook.VerifierFunc(func(r *http.Request, body []byte, secrets [][]byte, _ time.Time) error {
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
	})
	// In a Config: Verifier: github, and an EventFunc that takes the id from
	// the X-GitHub-Delivery header.

	secret := []byte("It's a Secret to Everybody")
	body := []byte("Hello, World!")
	r := httptest.NewRequest(http.MethodPost, "/webhooks/github", bytes.NewReader(body))
	// GitHub's documented test vector.
	r.Header.Set("X-Hub-Signature-256", "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")
	fmt.Println(github.Verify(r, body, [][]byte{secret}, time.Now()))
	fmt.Println(github.Verify(r, []byte("Hello, World?"), [][]byte{secret}, time.Now()))
	// Output:
	// <nil>
	// no signature matches the body
}
