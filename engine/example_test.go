package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// An operation is a named list of steps over an input and a state. A transactional
// step commits its writes with its checkpoint; an external step calls out with a
// derived idempotency key; the result is stored with the last step.
func Example() {
	ctx := context.Background()
	pool, cleanup := testdb.ExamplePool("example")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE wallet (owner text PRIMARY KEY, balance bigint NOT NULL)`); err != nil {
		panic(err)
	}

	type payIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	type payState struct {
		Balance   int64  `json:"balance"`
		PaymentID string `json:"paymentId"`
	}
	type payOut struct {
		Balance   int64  `json:"balance"`
		PaymentID string `json:"paymentId"`
	}

	debit := func(ctx context.Context, tx engine.Tx, in payIn, s *payState) error {
		return tx.QueryRow(ctx, `INSERT INTO wallet VALUES ($1, 100 - $2)
			ON CONFLICT (owner) DO UPDATE SET balance = wallet.balance - $2 RETURNING balance`,
			in.Owner, in.Amount).Scan(&s.Balance)
	}
	pay := func(ctx context.Context, call engine.Call, in payIn, s *payState) error {
		// A real step sends call.Key as the provider's Idempotency-Key.
		s.PaymentID = "pay_" + call.Key[len(engine.DerivedKeyPrefix):][:8]
		return nil
	}
	op, err := engine.NewOperation("payout", []engine.Step[payIn, payState]{
		engine.TxStep("debit", debit, nil),
		engine.ExternalStep("pay", pay, nil),
	}, func(in payIn, s *payState) (payOut, error) {
		return payOut{Balance: s.Balance, PaymentID: s.PaymentID}, nil
	}, nil)
	if err != nil {
		panic(err)
	}

	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	for range 2 { // the client retries: the second call replays the first
		started, err := engine.Start(ctx, e, op, "client-1", "order-42", payIn{Owner: "ann", Amount: 30}, nil)
		if err != nil {
			panic(err)
		}
		info, err := started.Wait(ctx)
		if err != nil {
			panic(err)
		}
		out, err := op.Result(info)
		if err != nil {
			panic(err)
		}
		fmt.Printf("created=%v status=%s balance=%d payment=%s\n", started.Created, info.Status, out.Balance, out.PaymentID)
	}
	// Output:
	// created=true status=succeeded balance=70 payment=pay_yFGDXnHk
	// created=false status=succeeded balance=70 payment=pay_yFGDXnHk
}
