// Command quickstart is a service that pays out from wallets through a bank,
// safe under retries and crashes: POST /payouts with an Idempotency-Key pays
// once however often it is sent; GET /operations/{id} shows a payout; /ops is
// the operators' page, /metrics Prometheus's.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemflow/idemflow/contrib/idemflowprom"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/steps/httpstep"
)

// Payout asks to pay Amount from a wallet.
type Payout struct {
	Wallet string `json:"wallet"`
	Amount int64  `json:"amount"`
}

// Paid is what the bank answered.
type Paid struct {
	BankID string `json:"id"`
}

// payouts is the operation: a debit that commits with its checkpoint (credited
// back if the bank says no), then the bank's call under the step's derived
// key, the same on every attempt, with a lookup by that key after a lost answer.
func payouts(bankURL string) (*engine.Operation[Payout, Paid, Paid], error) {
	debit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in Payout, _ *Paid) error {
		tag, err := tx.Exec(ctx, `UPDATE wallet SET balance = balance - $2 WHERE id = $1 AND balance >= $2`, in.Wallet, in.Amount)
		if err == nil && tag.RowsAffected() == 0 {
			return engine.Fail("insufficient_funds", "the wallet has less than that") // ends it: 422
		}
		return err // nil, or transient: tried again
	}
	credit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in Payout, _ *Paid) error {
		_, err := tx.Exec(ctx, `UPDATE wallet SET balance = balance + $2 WHERE id = $1`, in.Wallet, in.Amount)
		return err
	}
	bank := httpstep.Call[Payout, Paid]{
		RequestFunc: func(_ context.Context, _ engine.Attempt, in Payout, _ *Paid) (httpstep.Request, error) {
			return httpstep.Request{Method: http.MethodPost, URL: bankURL + "/payouts", Body: in}, nil
		},
		DecodeFunc: func(_ engine.Attempt, _ Payout, s *Paid, a httpstep.Answer) error { return json.Unmarshal(a.Body, s) },
		Lookup: &httpstep.Lookup[Payout, Paid]{
			URLFunc: func(at engine.Attempt, _ Payout, _ *Paid) string {
				return bankURL + "/payouts/by-key/" + url.PathEscape(at.Key)
			},
			NotFoundFunc: httpstep.HasCode("not_found"),
		},
	}
	return engine.NewOperation("payout", []engine.Step[Payout, Paid]{
		engine.TxStep("debit", debit).Compensate(credit),
		httpstep.Step("bank", bank),
	}, func(_ Payout, s *Paid) (Paid, error) { return *s, nil }, nil)
}

func decodePayout(_ *http.Request, f idempotency.Fields) (p Payout, err error) {
	err = cmp.Or(f.Only("wallet", "amount"), f.Required("wallet", &p.Wallet), f.Required("amount", &p.Amount))
	if err == nil && p.Amount <= 0 {
		err = &idempotency.FieldError{Param: "amount", Message: "must be positive"}
	}
	return p, err
}

func run(ctx context.Context, dbURL, bankURL, addr, adminToken string, reg prometheus.Registerer, g prometheus.Gatherer) error {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	engine.BoundPool(pc, nil) // statement and lock timeouts that fit the lease
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := engine.Migrate(ctx, pool, nil); err != nil { // idemflow's tables and River's
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS wallet (id text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		return err
	}
	op, err := payouts(bankURL)
	if err != nil {
		return err
	}
	metrics, err := idemflowprom.New(reg, nil)
	if err != nil {
		return err
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: metrics.Observer()})
	if err != nil {
		return err
	}
	if err := e.StartWorkers(ctx); err != nil { // retries and resumes run here
		return err
	}
	go metrics.Run(ctx, e)

	scope := func(r *http.Request) (string, error) { // your authentication: keys are per client
		if c := r.Header.Get("X-Client"); c != "" {
			return c, nil
		}
		return "", errors.New("an X-Client header is required")
	}
	idem := &idempotency.Config{Engine: e, ScopeFunc: scope, ObserveFunc: metrics.ObserveRequest}
	pay, err := idempotency.Handler(idem, op, &idempotency.EndpointOpts[Payout]{DecodeFunc: decodePayout})
	if err != nil {
		return err
	}
	read, err := idempotency.OperationHandler(idem, nil)
	if err != nil {
		return err
	}
	ops, err := opsweb.New(e, &opsweb.Config{AuthFunc: opsweb.TokenAuth(adminToken)})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payouts", pay)
	mux.Handle("GET /operations/{operationId}", read)
	mux.Handle("/ops", ops)
	mux.Handle("/ops/", ops)
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))

	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done(): // SIGTERM: stop taking requests, let running steps finish
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(stopCtx)
	return e.Stop(stopCtx) // what did not finish resumes in another process
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Getenv("DATABASE_URL"), os.Getenv("BANK_URL"), cmp.Or(os.Getenv("ADDR"), ":8080"),
		os.Getenv("ADMIN_TOKEN"), prometheus.DefaultRegisterer, prometheus.DefaultGatherer)
	if err != nil {
		log.Fatal(err)
	}
}
