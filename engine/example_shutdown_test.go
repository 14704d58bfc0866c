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

// The life of a service: migrate, build the engine, start its workers, serve,
// and on shutdown stop within a bound. What Stop cannot finish in time is
// cancelled and resumed later, by this process or another, from its last
// checkpoint.
func ExampleEngine_Stop() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_stop")
	defer cleanup()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	op, err := engine.NewOperation("greet", []engine.Step[string, struct{}]{
		engine.TxStep("greet", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in string, _ *struct{}) error { return nil }),
	}, func(in string, _ *struct{}) (string, error) { return "hello " + in, nil }, nil)
	if err != nil {
		panic(err)
	}

	// Safe from several processes at once; a no-op on an up-to-date database.
	if err := engine.Migrate(ctx, pool, &engine.MigrateOpts{Logger: logger}); err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Logger: logger})
	if err != nil {
		panic(err)
	}
	// Retries, resumes after a crash and retention run on these workers.
	if err := e.StartWorkers(ctx); err != nil {
		panic(err)
	}

	// Serve: a request handler starts an operation and waits for its answer.
	started, err := engine.Start(ctx, e, op, "client-1", "greet-1", "ann", nil)
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
	fmt.Println("served:", out)

	// Shutdown (after the HTTP server's own Shutdown): a bounded context, shorter
	// than the orchestrator's grace period.
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println("stop:", e.Stop(stopCtx))

	_, err = engine.Start(ctx, e, op, "client-1", "greet-2", "bob", nil)
	fmt.Println("start after stop is ErrStopped:", errors.Is(err, engine.ErrStopped))
	// Output:
	// served: hello ann
	// stop: <nil>
	// start after stop is ErrStopped: true
}
