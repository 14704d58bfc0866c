package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestMaxInFlightPerScope: a scope with its share of operations running is
// refused at once (ErrScopeBusy) with nothing reserved, while other scopes
// start, and a retry of its running key is answered as ever.
func TestMaxInFlightPerScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	op, err := engine.NewOperation("slow", []engine.Step[int, int]{
		engine.ExternalStep("wait", func(ctx context.Context, _ engine.Attempt, _ int, _ *int) error {
			select {
			case <-gate:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(testdb.Pool(t), &engine.Config{Operations: []engine.Definition{op}, MaxInFlightPerScope: 2, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })

	var running []*engine.Started
	for _, key := range []string{"a-1", "a-2"} {
		s, err := engine.Start(ctx, e, op, "client-a", key, 1, nil)
		require.NoError(t, err)
		running = append(running, s)
	}
	_, err = engine.Start(ctx, e, op, "client-a", "a-3", 1, nil)
	require.ErrorIs(t, err, engine.ErrScopeBusy)
	_, err = e.GetByKey(ctx, "client-a", "a-3")
	require.ErrorIs(t, err, engine.ErrNotFound, "nothing reserved")
	again, err := engine.Start(ctx, e, op, "client-a", "a-1", 1, nil)
	require.NoError(t, err, "a retry needs no room")
	require.False(t, again.Created)
	other, err := engine.Start(ctx, e, op, "client-b", "b-1", 1, nil)
	require.NoError(t, err, "another client has its own share")

	close(gate)
	for _, s := range append(running, other) {
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status)
	}
	s, err := engine.Start(ctx, e, op, "client-a", "a-3", 1, nil)
	require.NoError(t, err, "room again once its operations ended")
	_, err = s.Wait(ctx)
	require.NoError(t, err)

	_, err = engine.New(testdb.Pool(t), &engine.Config{MaxInFlightPerScope: engine.Off})
	require.NoError(t, err, "Off: no bound")
}
