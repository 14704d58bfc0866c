package idemflowtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A test of an operation: a database of its own, an engine with short test
// timings and its workers started (stopped when the test ends), and a wait for
// the end. (An example has no *testing.T, so this one only compiles.)
func ExampleEngine() {
	type refundIn struct{ Amount int64 }
	refund, err := engine.NewOperation("refund", []engine.Step[refundIn, struct{}]{
		engine.TxStep("record", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in refundIn, _ *struct{}) error {
			return nil // the service's own writes, in the step's transaction
		}),
	}, func(refundIn, *struct{}) (string, error) { return "refunded", nil }, nil)
	if err != nil {
		panic(err)
	}

	testRefund := func(t *testing.T) {
		t.Parallel()
		pool := idemflowtest.Pool(t, nil)
		e := idemflowtest.Engine(t, pool, nil, refund)
		s, err := engine.Start(t.Context(), e, refund, "shop", "order-1", refundIn{Amount: 100}, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)
	}
	_ = testRefund
}

// A test that drives the engine by hand: no workers, so nothing resumes or
// retries an operation until the test says so.
func ExampleNewEngine() {
	testSweep := func(t *testing.T) {
		e := idemflowtest.NewEngine(t, idemflowtest.Pool(t, nil), &engine.Config{Lease: 15 * time.Second})
		// ... start an operation, make its lease expire ...
		require.NoError(t, e.Sweep(t.Context()))
		require.NoError(t, e.StartWorkers(t.Context()))
	}
	_ = testSweep
}

// A Run whose card service the fault matrix reaches through the kit's proxy:
// the service's URL in Env, and how it says "declined" and "pending", so that
// the operation's own decoding meets a decline, and a pending charge that
// then succeeds or fails. (An example has no *testing.T, so this one only
// compiles.)
func ExampleService() {
	card := idemflowtest.Service{
		Declined: func(string) idemflowtest.Answer {
			return idemflowtest.Answer{Status: 402, Body: `{"code":"card_declined"}`}
		},
		Pending: func(key string) idemflowtest.Answer {
			return idemflowtest.Answer{Status: 202, Body: `{"id":"ch_` + key + `","status":"pending"}`}
		},
		LookupPending: func(key string) idemflowtest.Answer {
			return idemflowtest.Answer{Status: 200, Body: `{"id":"ch_` + key + `","status":"pending"}`}
		},
		LookupFailed: func(key string) idemflowtest.Answer {
			return idemflowtest.Answer{Status: 200, Body: `{"id":"ch_` + key + `","status":"failed"}`}
		},
	}
	setup := func(t *testing.T, cardURL string) *idemflowtest.Run {
		return &idemflowtest.Run{
			Env:      map[string]string{"card": cardURL},
			Services: map[string]idemflowtest.Service{"card": card},
			Check: func(ctx context.Context, info *engine.Info) error {
				return nil // charged and credited once if it succeeded; neither if it failed
			},
		}
	}
	_ = setup
}
