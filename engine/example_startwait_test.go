package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A caller that waits for the answer says so with StartOpts.Wait: Start
// returns once the first attempt has ended (or Wait after the reservation),
// and Started.Wait answers at once.
func ExampleStartOpts_wait() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_start_wait")
	defer cleanup()

	greet, err := engine.NewOperation("greet", []engine.Step[string, string]{
		engine.ExternalStep("compose", func(_ context.Context, _ engine.Attempt, name string, s *string) error {
			*s = "hello, " + name
			return nil
		}),
	}, func(_ string, s *string) (string, error) { return *s, nil }, nil)
	if err != nil {
		panic(err)
	}
	if err := engine.Migrate(ctx, pool, nil); err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{greet}})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()

	started, err := engine.Start(ctx, e, greet, "client-1", "key-1", "ann", &engine.StartOpts{Wait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	info, err := started.Wait(ctx) // the attempt has ended: no wait
	if err != nil {
		panic(err)
	}
	out, err := greet.Result(info)
	if err != nil {
		panic(err)
	}
	fmt.Println(started.Created, !started.ReservedAt.IsZero(), info.Status, out)
	// Output: true true succeeded hello, ann
}
