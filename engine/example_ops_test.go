package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A provider's answer that does not match the request is neither a success nor
// a failure that may be undone, so the step halts and the operation waits for a
// person. Once the cause is mended, Retry runs it again from the halted step:
// the debit that had succeeded is not made twice.
func ExampleEngine_Retry() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_retry")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE retry_wallet (owner text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO retry_wallet VALUES ('ann', 100)`); err != nil {
		panic(err)
	}

	type payIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	var providerFixed atomic.Bool // what the operator mends, here a provider's bug
	debit := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in payIn, _ *struct{}) error {
		_, err := tx.Exec(ctx, `UPDATE retry_wallet SET balance = balance - $2 WHERE owner = $1`, in.Owner, in.Amount)
		return err
	}
	pay := func(ctx context.Context, call engine.Attempt, in payIn, _ *struct{}) error {
		if !providerFixed.Load() {
			return engine.Halt("amount_mismatch", fmt.Sprintf("the provider confirmed %d for a payout of %d", 10*in.Amount, in.Amount))
		}
		return nil
	}
	op, err := engine.NewOperation("payout", []engine.Step[payIn, struct{}]{
		engine.TxStep("debit", debit),
		engine.ExternalStep("pay", pay),
	}, func(in payIn, _ *struct{}) (int64, error) { return in.Amount, nil }, nil)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		// Parking an operation is logged as a warning, by design.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		panic(err)
	}
	if err := e.StartWorkers(ctx); err != nil { // a retried operation runs on a River worker
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, op, "client-1", "payout-1", payIn{Owner: "ann", Amount: 30}, nil)
	if err != nil {
		panic(err)
	}
	// A parked operation does not finish, so Wait would not return: an operator
	// finds it with Get (or List). Here we look until it asks for one.
	info, err := e.Get(ctx, started.ID)
	for err == nil && !info.NeedsAttention() {
		pause, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		_, _ = started.Wait(pause)
		cancel()
		info, err = e.Get(ctx, started.ID)
	}
	if err != nil {
		panic(err)
	}
	fmt.Printf("before: %s, parked=%v, attention=%s\n", info.Status, info.Parked, info.Attention.Code)

	providerFixed.Store(true)
	if _, err := e.Retry(ctx, started.ID, nil); err != nil {
		panic(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err = e.Wait(waitCtx, started.ID)
	if err != nil {
		panic(err)
	}
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM retry_wallet WHERE owner = 'ann'`).Scan(&balance); err != nil {
		panic(err)
	}
	fmt.Printf("after: %s, balance=%d\n", info.Status, balance)
	// Output:
	// before: in_progress, parked=true, attention=amount_mismatch
	// after: succeeded, balance=70
}

// An operation that waits for a retry (here the provider is down and the next
// attempt is an hour away) can be cancelled: its lookup is asked first whether
// the charge went through (without a Lookup nobody can tell, and Cancel refuses
// with ErrPastPivot), then the hold is released, and the operation ends failed
// with CodeCancelled.
func ExampleEngine_Cancel() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_cancel")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE cancel_hold (owner text PRIMARY KEY, amount bigint NOT NULL, released bool NOT NULL DEFAULT false)`); err != nil {
		panic(err)
	}

	type buyIn struct {
		Owner  string `json:"owner"`
		Amount int64  `json:"amount"`
	}
	hold := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in buyIn, _ *struct{}) error {
		_, err := tx.Exec(ctx, `INSERT INTO cancel_hold (owner, amount) VALUES ($1, $2)`, in.Owner, in.Amount)
		return err
	}
	release := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in buyIn, _ *struct{}) error {
		_, err := tx.Exec(ctx, `UPDATE cancel_hold SET released = true WHERE owner = $1`, in.Owner)
		return err
	}
	charge := func(ctx context.Context, call engine.Attempt, in buyIn, _ *struct{}) error {
		return errors.New("provider unavailable") // transient: retried after the backoff
	}
	chargeFound := func(ctx context.Context, call engine.Attempt, in buyIn, _ *struct{}) (bool, error) {
		return false, nil // a real lookup asks the provider for call.Key
	}
	op, err := engine.NewOperation("buy", []engine.Step[buyIn, struct{}]{
		engine.TxStep("hold", hold).Compensate(release),
		// This provider carries out a request within 50 ms of its sending, or
		// never: a lookup that finds nothing after that is the word "not made".
		engine.ExternalStep("charge", charge).Lookup(chargeFound).Window(50 * time.Millisecond),
	}, func(in buyIn, _ *struct{}) (int64, error) { return in.Amount, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Hour}})
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, op, "client-1", "buy-1", buyIn{Owner: "ann", Amount: 30}, nil)
	if err != nil {
		panic(err)
	}
	// The first attempt holds the operation until it has handed the retry to
	// River: until then Cancel answers ErrRunning, and is asked again. Then,
	// until the charge's outcome window has passed, the request it sent may
	// still land: Cancel answers an *RefusedError saying when it will
	// be known, and undoes nothing.
	info, err := e.Cancel(ctx, started.ID, "the customer gave up")
	for errors.Is(err, engine.ErrRunning) || errors.Is(err, engine.ErrOutcomeUnknown) {
		pause := 10 * time.Millisecond
		if ou := (*engine.RefusedError)(nil); errors.As(err, &ou) && !ou.KnownAt.IsZero() {
			pause = time.Until(ou.KnownAt)
		}
		time.Sleep(pause)
		info, err = e.Cancel(ctx, started.ID, "the customer gave up")
	}
	if err != nil {
		panic(err)
	}
	var released bool
	if err := pool.QueryRow(ctx, `SELECT released FROM cancel_hold WHERE owner = 'ann'`).Scan(&released); err != nil {
		panic(err)
	}
	fmt.Printf("status=%s code=%s released=%v\n", info.Status, info.Error.Code, released)
	// Output:
	// status=failed code=cancelled released=true
}

// Once a step that cannot be undone (an external step without a Compensate:
// the payout has left) has succeeded, the operation only goes forward: Cancel
// refuses it, changing nothing, and the later step is retried until it succeeds.
func ExampleEngine_Cancel_pastPivot() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_cancel_past_pivot")
	defer cleanup()

	pay := func(ctx context.Context, call engine.Attempt, in int64, _ *struct{}) error {
		return nil // the provider paid out
	}
	record := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int64, _ *struct{}) error {
		return errors.New("ledger unavailable") // transient: retried after the backoff
	}
	op, err := engine.NewOperation("payout", []engine.Step[int64, struct{}]{
		engine.ExternalStep("pay", pay),
		engine.TxStep("record", record),
	}, func(in int64, _ *struct{}) (int64, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Hour}})
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, op, "client-1", "payout-1", 30, nil)
	if err != nil {
		panic(err)
	}
	_, err = e.Cancel(ctx, started.ID, "the customer gave up")
	for errors.Is(err, engine.ErrRunning) { // the first attempt still holds it
		pause, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		_, _ = started.Wait(pause)
		cancel()
		_, err = e.Cancel(ctx, started.ID, "the customer gave up")
	}
	info, getErr := e.Get(ctx, started.ID)
	if getErr != nil {
		panic(getErr)
	}
	fmt.Printf("past pivot=%v status=%s\n", errors.Is(err, engine.ErrPastPivot), info.Status)
	// Output:
	// past pivot=true status=in_progress
}
