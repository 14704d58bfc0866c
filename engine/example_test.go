package engine_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// An operation is a named list of steps over an input and a state. A transactional
// step commits its writes with its checkpoint; an external step calls out with a
// derived idempotency key; the result is stored with the last step.
func Example() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example")
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

	debit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payIn, s *payState) error {
		return tx.QueryRow(ctx, `INSERT INTO wallet VALUES ($1, 100 - $2)
			ON CONFLICT (owner) DO UPDATE SET balance = wallet.balance - $2 RETURNING balance`,
			in.Owner, in.Amount).Scan(&s.Balance)
	}
	pay := func(ctx context.Context, call engine.Attempt, in payIn, s *payState) error {
		// A real step sends call.Key, the same on every attempt of this step of
		// this operation, as the provider's Idempotency-Key.
		s.PaymentID = "pay_" + in.Owner
		return nil
	}
	op, err := engine.NewOperation("payout", []engine.Step[payIn, payState]{
		engine.TxStep("debit", debit),
		engine.ExternalStep("pay", pay),
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
	// created=true status=succeeded balance=70 payment=pay_ann
	// created=false status=succeeded balance=70 payment=pay_ann
}

// A write whose result the step does not read can go with the step's
// checkpoint and COMMIT: the step's transaction, the key's reservation
// included, is then one round trip. The statement must fail on its own when the
// step must not succeed; idemflow_fail fails it for good, with a code.
func ExampleAtCommit() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_at_commit")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE account (owner text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO account VALUES ('ann', 50)`); err != nil {
		panic(err)
	}

	type withdrawIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	withdraw := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in withdrawIn, _ *struct{}) error {
		_, err := engine.AtCommit(tx).Exec(ctx, `
			WITH w AS (UPDATE account SET balance = balance - $2 WHERE owner = $1 AND balance >= $2 RETURNING 1)
			SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM w)
			            THEN idemflow_fail('insufficient_funds', format('%s has less than %s', $1::text, $2::bigint)) END`,
			in.Owner, in.Amount)
		return err
	}
	op, err := engine.NewOperation("withdraw", []engine.Step[withdrawIn, struct{}]{
		engine.TxStep("withdraw", withdraw),
	}, func(in withdrawIn, _ *struct{}) (int64, error) { return in.Amount, nil }, nil)
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

	for _, key := range []string{"w-1", "w-2"} {
		started, err := engine.Start(ctx, e, op, "client-1", key, withdrawIn{Owner: "ann", Amount: 30}, nil)
		if err != nil {
			panic(err)
		}
		info, err := started.Wait(ctx)
		if err != nil {
			panic(err)
		}
		if info.Error != nil {
			fmt.Printf("%s: %s %s: %s\n", key, info.Status, info.Error.Code, info.Error.Message)
			continue
		}
		fmt.Printf("%s: %s\n", key, info.Status)
	}
	// Output:
	// w-1: succeeded
	// w-2: failed insufficient_funds: ann has less than 30
}
