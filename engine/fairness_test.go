package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
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

// TestRoomBeforeAnswer: a run gives its place in the process's bounds back
// before its starter hears that it ended, so that a client that starts its
// next operation at once is never refused for one that has ended. The first
// run is held in the observer's RunEnded, which it calls after its starter
// heard, while the client starts the next.
func TestRoomBeforeAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op, err := engine.NewOperation("quick", []engine.Step[int, int]{
		engine.ExternalStep("noop", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		cfg  engine.Config
		want error // what the next start would meet while the first holds its place
	}{
		{"MaxInFlight", engine.Config{MaxInFlight: 1}, engine.ErrOverloaded},
		{"MaxInFlightPerScope", engine.Config{MaxInFlightPerScope: 1}, engine.ErrScopeBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var first atomic.Pointer[uuid.UUID]
			held, release := make(chan struct{}), make(chan struct{})
			cfg := tc.cfg
			cfg.Operations = []engine.Definition{op}
			cfg.Observer = &engine.Observer{RunEnded: func(_ context.Context, ev engine.OperationEvent, _ engine.RunEnd, _ error) {
				if id := first.Load(); id != nil && *id == ev.ID {
					close(held)
					<-release
				}
			}}
			e, err := engine.New(testdb.Pool(t), &cfg)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })

			s, err := engine.Start(ctx, e, op, "client", "k-1", 1, nil)
			require.NoError(t, err)
			first.Store(&s.ID)
			info, err := s.Wait(ctx)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, info.Status)
			select {
			case <-held: // the first run has told its starter, and is still running
			case <-time.After(10 * time.Second):
				t.Fatal("the first run never reached RunEnded")
			}
			next, err := engine.Start(ctx, e, op, "client", "k-2", 1, nil)
			close(release)
			require.NoError(t, err, "a place held after the answer would refuse it: %v", tc.want)
			_, err = next.Wait(ctx)
			require.NoError(t, err)
		})
	}
}

// TestRoomBeforeAnswerResume: the same for a run on a River worker, whose
// place in its scope is the worker's: an operation started with StartTx, and
// its client's next start once Engine.Wait has answered.
func TestRoomBeforeAnswerResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op, err := engine.NewOperation("quick", []engine.Step[int, int]{
		engine.ExternalStep("noop", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	var first atomic.Pointer[uuid.UUID]
	held, release := make(chan struct{}), make(chan struct{})
	pool := testdb.Pool(t)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, MaxInFlightPerScope: 1,
		Observer: &engine.Observer{RunEnded: func(_ context.Context, ev engine.OperationEvent, _ engine.RunEnd, _ error) {
			if id := first.Load(); id != nil && *id == ev.ID {
				close(held)
				<-release
			}
		}}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	s, err := engine.StartTx(ctx, tx, e, op, "client", "k-1", 1, nil)
	require.NoError(t, err)
	first.Store(&s.ID)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, e.StartWorkers(ctx))
	info, err := e.Wait(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's run never reached RunEnded")
	}
	next, err := engine.Start(ctx, e, op, "client", "k-2", 1, nil)
	close(release)
	require.NoError(t, err, "the worker's place held after the answer would refuse it")
	_, err = next.Wait(ctx)
	require.NoError(t, err)
}
