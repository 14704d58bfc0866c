package payout_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
	"github.com/idemflow/idemflow/workflows/payout"
)

// newExample sets up what a service does at start, against a fresh database
// and a fake bank: the payout's tables and a funded wallet, the operation
// with cfg (its BankURL the fake bank's), and an engine with its workers. It
// returns the engine, the operation and the function that stops it all.
func newExample(name string, bank *fakeservice.Service, cfg payout.Config) (*engine.Engine, *engine.Operation[payout.Input, payout.State, payout.Result], func()) {
	ctx := context.Background()
	// A migrated database (engine.Migrate's tables), as a service has after
	// engine.Migrate at start.
	pool, dropDB := idemflowtest.ExamplePool(name)
	srv := httptest.NewServer(bank)
	if err := payout.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO payout_wallet (id, balance) VALUES ('ann', 100)`); err != nil {
		panic(err)
	}

	cfg.BankURL = srv.URL
	op, err := payout.New(cfg)
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
	if err := e.StartWorkers(ctx); err != nil {
		panic(err)
	}
	return e, op, func() {
		_ = e.Stop(ctx)
		srv.Close()
		dropDB()
	}
}

// waitsAt waits until the payout id waits at step, and returns the step.
func waitsAt(e *engine.Engine, id uuid.UUID, step string) engine.StepInfo {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		info, err := e.Get(ctx, id)
		if err != nil {
			panic(err)
		}
		for _, s := range info.Steps {
			if s.Name == step && s.Status == engine.StepStatusWaiting {
				return s
			}
		}
		select {
		case <-ctx.Done():
			panic("the payout never waited at " + step)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// pay starts a payout under the client's key, waits for it, and prints its
// outcome.
func pay(e *engine.Engine, op *engine.Operation[payout.Input, payout.State, payout.Result], key string, in payout.Input) {
	ctx := context.Background()
	started, err := engine.Start(ctx, e, op, "client-1", key, in, nil)
	if err != nil {
		panic(err)
	}
	info, err := started.Wait(ctx)
	if err != nil {
		panic(err)
	}
	switch {
	case info.Status == engine.StatusSucceeded:
		out, err := op.Result(info)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s created=%t: paid %d from %s as %s, balance %d\n", key, started.Created, out.Amount, out.Wallet, out.BankPayoutID, out.Balance)
	case info.Error != nil:
		fmt.Printf("%s created=%t: %s %s: %s\n", key, started.Created, info.Status, info.Error.Code, info.Error.Message)
	default:
		fmt.Printf("%s created=%t: %s, parked %t\n", key, started.Created, info.Status, info.Parked)
	}
}

// A payout debits the wallet, has the bank pay under the derived key, and
// records the bank's payout id. The client's retry of its key gets the stored
// answer: one debit, one bank payout. A payout beyond the balance fails before
// the bank is called.
func Example() {
	bank := fakeservice.New(nil)
	e, op, stop := newExample("payout_example", bank, payout.Config{})
	defer stop()

	in := payout.Input{Wallet: "ann", Amount: 30, Destination: "DE89370400440532013000"}
	pay(e, op, "payout-1", in)
	pay(e, op, "payout-1", in) // the client retries
	pay(e, op, "payout-2", payout.Input{Wallet: "ann", Amount: 80, Destination: "DE89370400440532013000"})
	fmt.Println("bank payouts:", bank.Effects(), "requests:", bank.Requests())

	// Output:
	// payout-1 created=true: paid 30 from ann as fs_1, balance 70
	// payout-1 created=false: paid 30 from ann as fs_1, balance 70
	// payout-2 created=true: failed insufficient_funds: wallet ann has less than 80
	// bank payouts: 1 requests: 1
}

// A bank that declines the payout fails it with the bank's code; the debit's
// compensation credits the wallet back.
func Example_declined() {
	bank := fakeservice.New(&fakeservice.Options{AnswerFunc: func(fakeservice.Request) (int, any) {
		return http.StatusUnprocessableEntity, map[string]string{"code": "declined", "message": "the account is closed"}
	}})
	e, op, stop := newExample("payout_example_declined", bank, payout.Config{})
	defer stop()

	pay(e, op, "payout-1", payout.Input{Wallet: "ann", Amount: 30, Destination: "DE89370400440532013000"})
	// The whole balance: the first payout's 30 was credited back, or the debit
	// would refuse it with insufficient_funds.
	pay(e, op, "payout-2", payout.Input{Wallet: "ann", Amount: 100, Destination: "DE89370400440532013000"})
	fmt.Println("bank payouts:", bank.Effects(), "requests:", bank.Requests())

	// Output:
	// payout-1 created=true: failed declined: the account is closed
	// payout-2 created=true: failed declined: the account is closed
	// bank payouts: 0 requests: 2
}

// A payout at or above the approval threshold waits, its amount held, until
// an operator approves it; one with a release date then waits for the date,
// with no process busy on it, before the bank is called. A payout that an
// operator rejects is credited back, and the bank hears nothing.
func Example_approvalAndReleaseDate() {
	bank := fakeservice.New(nil)
	e, op, stop := newExample("payout_example_waits", bank, payout.Config{ApprovalThreshold: 50})
	defer stop()
	ctx := context.Background()

	releaseAt := time.Now().Add(300 * time.Millisecond)
	in := payout.Input{Wallet: "ann", Amount: 50, Destination: "DE89370400440532013000", ReleaseAt: releaseAt}
	started, err := engine.Start(ctx, e, op, "client-1", "payout-1", in, nil)
	if err != nil {
		panic(err)
	}
	w := waitsAt(e, started.ID, "approval").Wait
	fmt.Printf("payout-1 waits for %s: %d of %d\n", w.Reason, len(w.ApprovedBy), w.Need)
	list, err := e.Approvals(ctx, 0)
	if err != nil {
		panic(err)
	}
	for _, a := range list {
		fmt.Printf("awaiting approval: %s at step %s\n", a.Key, a.Step)
	}
	if _, err := e.Approve(engine.WithActor(ctx, "ops-ann"), started.ID, "beneficiary checked"); err != nil {
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
	fmt.Printf("payout-1: paid %d from %s as %s, balance %d\n", out.Amount, out.Wallet, out.BankPayoutID, out.Balance)
	full, err := e.Get(ctx, started.ID)
	if err != nil {
		panic(err)
	}
	for _, s := range full.Steps {
		if s.Name == "release" {
			fmt.Println("released on its date:", !s.FinishedAt.Before(releaseAt))
		}
	}

	started, err = engine.Start(ctx, e, op, "client-1", "payout-2", payout.Input{Wallet: "ann", Amount: 50, Destination: "DE89370400440532013000"}, nil)
	if err != nil {
		panic(err)
	}
	waitsAt(e, started.ID, "approval")
	if _, err := e.Reject(engine.WithActor(ctx, "ops-bob"), started.ID, "unknown beneficiary"); err != nil {
		panic(err)
	}
	info, err = started.Wait(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("payout-2: %s %s: %s\n", info.Status, info.Error.Code, info.Error.Message)
	// Below the threshold, so no approval; and it fits only because
	// payout-2's 50 was credited back.
	pay(e, op, "payout-3", payout.Input{Wallet: "ann", Amount: 49, Destination: "DE89370400440532013000"})
	fmt.Println("bank payouts:", bank.Effects(), "requests:", bank.Requests())

	// Output:
	// payout-1 waits for approval: 0 of 1
	// awaiting approval: payout-1 at step approval
	// payout-1: paid 50 from ann as fs_1, balance 50
	// released on its date: true
	// payout-2: failed rejected: the operation was rejected by an operator
	// payout-3 created=true: paid 49 from ann as fs_2, balance 1
	// bank payouts: 2 requests: 2
}
