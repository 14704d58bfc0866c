package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/schedule"
	"github.com/idemflow/idemflow/idemflowtest"
)

// Every process computes the same slot for the same instant, in UTC, whatever
// its time zone.
func ExampleSlot() {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		panic(err)
	}
	t := time.Date(2026, 12, 1, 11, 42, 7, 0, paris) // 10:42:07 UTC
	fmt.Println(schedule.Slot(t, time.Hour))
	fmt.Println(schedule.Slot(t, 15*time.Minute))
	fmt.Println(schedule.Slot(t, 24*time.Hour))
	fmt.Println(schedule.Slot(t, 7*24*time.Hour)) // a Monday
	// Output:
	// 2026-12-01 10:00:00 +0000 UTC
	// 2026-12-01 10:30:00 +0000 UTC
	// 2026-12-01 00:00:00 +0000 UTC
	// 2026-11-30 00:00:00 +0000 UTC
}

// A slot's key names the operation type and the slot: two scheduled
// operation types of one scope never share a key.
func ExampleKey() {
	slot := schedule.Slot(time.Date(2026, 12, 1, 10, 42, 7, 0, time.UTC), time.Hour)
	fmt.Println(schedule.Key("statement", slot))
	fmt.Println(schedule.Key("interest", slot))
	// Output:
	// schedule statement 2026-12-01T10:00:00Z
	// schedule interest 2026-12-01T10:00:00Z
}

// Two processes fire the same slot: the first starts its operation, the
// second finds it. The input is built from the slot alone, so both build the
// same.
func ExampleFire() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("schedule_example_fire")
	defer cleanup()
	if _, err := pool.Exec(ctx, `CREATE TABLE statement (scope text NOT NULL, slot timestamptz NOT NULL)`); err != nil {
		panic(err)
	}

	type statementIn struct {
		Slot time.Time `json:"slot"`
	}
	type statementState struct{}
	// The step's writes commit with the slot's reservation, or not at all: a
	// firing that finds the slot taken writes nothing.
	send := func(ctx context.Context, tx engine.Tx, at engine.Attempt, in statementIn, _ *statementState) error {
		_, err := tx.Exec(ctx, `INSERT INTO statement (scope, slot) VALUES ($1, $2)`, at.Scope, in.Slot)
		return err
	}
	op, err := engine.NewOperation("statement", []engine.Step[statementIn, statementState]{
		engine.TxStep("send", send),
	}, func(statementIn, *statementState) (struct{}, error) { return struct{}{}, nil }, nil)
	if err != nil {
		panic(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var engines [2]*engine.Engine // two processes
	for i := range engines {
		if engines[i], err = engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: logger}); err != nil {
			panic(err)
		}
		defer func() { _ = engines[i].Stop(ctx) }()
	}

	slot := schedule.Slot(time.Date(2026, 12, 1, 10, 0, 3, 0, time.UTC), time.Hour)
	for i, e := range engines {
		started, err := schedule.Fire(ctx, e, op, "client-1", slot, statementIn{Slot: slot})
		if err != nil {
			panic(err)
		}
		info, err := started.Wait(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Printf("process %d: created=%t, %s\n", i, started.Created, info.Status)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM statement`).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("statements:", n)
	// Output:
	// process 0: created=true, succeeded
	// process 1: created=false, succeeded
	// statements: 1
}
