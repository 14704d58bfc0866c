package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// StartTx reserves the key in the application's own transaction, so that the
// order and the operation that charges it commit together or not at all: no
// order without its charge, no charge for an order that was never placed.
func ExampleStartTx() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_start_tx")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE shop_order (id text PRIMARY KEY, amount bigint NOT NULL, charge text)`); err != nil {
		panic(err)
	}

	type chargeIn struct {
		Order  string `json:"order"`
		Amount int64  `json:"amount"`
	}
	type chargeState struct {
		ChargeID string `json:"chargeId"`
	}
	charge := func(ctx context.Context, call engine.Attempt, in chargeIn, s *chargeState) error {
		s.ChargeID = "ch_" + in.Order // a real step sends call.Key to the provider
		return nil
	}
	markPaid := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in chargeIn, s *chargeState) error {
		_, err := tx.Exec(ctx, `UPDATE shop_order SET charge = $2 WHERE id = $1`, in.Order, s.ChargeID)
		return err
	}
	op, err := engine.NewOperation("charge_order", []engine.Step[chargeIn, chargeState]{
		engine.ExternalStep("charge", charge),
		engine.TxStep("mark_paid", markPaid),
	}, func(in chargeIn, s *chargeState) (string, error) { return s.ChargeID, nil }, nil)
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
	// An operation started with StartTx runs on a River worker, not in the caller.
	if err := e.StartWorkers(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	place := func(order string, commit bool) *engine.Started {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO shop_order (id, amount) VALUES ($1, 30)`, order); err != nil {
			panic(err)
		}
		started, err := engine.StartTx(ctx, tx, e, op, "shop", order, chargeIn{Order: order, Amount: 30}, nil)
		if err != nil {
			panic(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				panic(err)
			}
		}
		return started
	}

	started := place("o-1", true)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := started.Wait(waitCtx)
	if err != nil {
		panic(err)
	}
	out, err := op.Result(info)
	if err != nil {
		panic(err)
	}
	var paid string
	if err := pool.QueryRow(ctx, `SELECT charge FROM shop_order WHERE id = 'o-1'`).Scan(&paid); err != nil {
		panic(err)
	}
	fmt.Printf("o-1: %s, result %s, order charged %s\n", info.Status, out, paid)

	// Rolled back: neither the order nor its operation exists.
	place("o-2", false)
	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shop_order WHERE id = 'o-2'`).Scan(&orders); err != nil {
		panic(err)
	}
	_, err = e.GetByKey(ctx, "shop", "o-2")
	fmt.Printf("o-2: orders %d, operation not found %v\n", orders, errors.Is(err, engine.ErrNotFound))
	// Output:
	// o-1: succeeded, result ch_o-1, order charged ch_o-1
	// o-2: orders 0, operation not found true
}
