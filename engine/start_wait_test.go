package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// gated is an operation whose one step waits until open is called; a test
// that ends first opens it before the engine stops.
func gated(t *testing.T, cfg *engine.Config) (e *engine.Engine, op *engine.Operation[int, int, int], open func()) {
	t.Helper()
	gate := make(chan struct{})
	open = sync.OnceFunc(func() { close(gate) })
	var err error
	op, err = engine.NewOperation("gated", []engine.Step[int, int]{
		engine.ExternalStep("wait", func(ctx context.Context, _ engine.Attempt, in int, s *int) error {
			select {
			case <-gate:
				*s = in * 2
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}),
	}, func(_ int, s *int) (int, error) { return *s, nil }, nil)
	require.NoError(t, err)
	cfg.Operations = []engine.Definition{op}
	e, err = engine.New(testdb.Pool(t), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	t.Cleanup(open) // first
	return e, op, open
}

// ended reports whether s's attempt has ended: Wait with a ctx that has ended
// answers only an attempt that has.
func ended(t *testing.T, s *engine.Started) (*engine.Info, bool) {
	t.Helper()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	info, err := s.Wait(gone)
	if errors.Is(err, context.Canceled) {
		return nil, false
	}
	require.NoError(t, err)
	return info, true
}

// TestStartWait: with StartOpts.Wait, Start returns with the attempt's end
// when it comes within Wait, and with the reservation after Wait or when ctx
// ends; the answers of a start that reserved nothing are as without it.
func TestStartWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Ended", func(t *testing.T) {
		t.Parallel()
		e, op, open := gated(t, &engine.Config{})
		before := time.Now()
		time.AfterFunc(50*time.Millisecond, open) // well after the reservation
		s, err := engine.Start(ctx, e, op, "c", "k", 21, &engine.StartOpts{Wait: 10 * time.Second})
		require.NoError(t, err)
		require.True(t, s.Created)
		require.False(t, s.ReservedAt.Before(before), "ReservedAt: %v, before the start at %v", s.ReservedAt, before)
		require.False(t, s.ReservedAt.After(time.Now()))
		info, ok := ended(t, s)
		require.True(t, ok, "Start returned before the attempt ended")
		require.Equal(t, engine.StatusSucceeded, info.Status)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.Equal(t, 42, out)
	})

	t.Run("WaitPassed", func(t *testing.T) {
		t.Parallel()
		e, op, open := gated(t, &engine.Config{})
		s, err := engine.Start(ctx, e, op, "c", "k", 1, &engine.StartOpts{Wait: 50 * time.Millisecond})
		require.NoError(t, err)
		require.True(t, s.Created)
		require.GreaterOrEqual(t, time.Since(s.ReservedAt), 50*time.Millisecond, "Start returned before Wait had passed")
		_, ok := ended(t, s)
		require.False(t, ok, "the attempt waits for its gate")
		open()
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status)
	})

	t.Run("ContextEnded", func(t *testing.T) {
		t.Parallel()
		e, op, open := gated(t, &engine.Config{})
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		s, err := engine.Start(short, e, op, "c", "k", 1, &engine.StartOpts{Wait: time.Minute})
		require.NoError(t, err, "a reservation that committed is the answer, whatever ctx")
		require.True(t, s.Created)
		require.Error(t, short.Err())
		open()
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status)
	})

	t.Run("KeyTaken", func(t *testing.T) {
		t.Parallel()
		e, op, open := gated(t, &engine.Config{})
		first, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		again, err := engine.Start(ctx, e, op, "c", "k", 1, &engine.StartOpts{Wait: time.Minute})
		require.NoError(t, err)
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, engine.StatusInProgress, again.Existing.Status)
		require.True(t, again.ReservedAt.IsZero())

		_, err = engine.Start(ctx, e, op, "c", "k", 2, &engine.StartOpts{Wait: time.Minute})
		var reused *engine.ReusedError
		require.ErrorAs(t, err, &reused)
		open()
		_, err = first.Wait(ctx)
		require.NoError(t, err)
	})
}
