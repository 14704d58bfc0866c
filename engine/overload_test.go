package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestMaxInFlight: beyond Config.MaxInFlight a Start with a free key answers
// ErrOverloaded at once and reserves nothing; one whose key is taken is
// answered as always, with the operation or ReusedError.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	op, err := engine.NewOperation("held", []engine.Step[int, int]{
		engine.ExternalStep("wait", func(ctx context.Context, _ engine.Attempt, in int, _ *int) error {
			if in == 1 {
				entered <- struct{}{}
				<-release
			}
			return nil
		}).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, MaxInFlight: 1, Lease: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	first, err := engine.Start(ctx, e, op, "c", "k1", 1, nil)
	require.NoError(t, err)
	<-entered

	_, err = engine.Start(ctx, e, op, "c", "k2", 2, nil)
	require.ErrorIs(t, err, engine.ErrOverloaded)
	again, err := engine.Start(ctx, e, op, "c", "k1", 1, nil)
	require.NoError(t, err, "a retry needs no room")
	require.False(t, again.Created)
	require.Equal(t, first.ID, again.ID)
	_, err = engine.Start(ctx, e, op, "c", "k1", 3, nil)
	require.ErrorAs(t, err, new(*engine.ReusedError))

	close(release)
	_, err = first.Wait(ctx)
	require.NoError(t, err)
	// The first run gives its room back just after its waiters hear of it.
	var second *engine.Started
	require.Eventually(t, func() bool {
		second, err = engine.Start(ctx, e, op, "c", "k2", 2, nil)
		return !errors.Is(err, engine.ErrOverloaded)
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, err)
	require.True(t, second.Created, "the overloaded start reserved nothing")
	info, err := second.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
}
