package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
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

// endHold is a one-step operation whose run of the held operation is held in
// the observer's RunEnded, which a run calls after its starter and waiters
// heard that it ended: the run is over, and still holds whatever end has not
// given back.
type endHold struct {
	op            *engine.Operation[int, int, int]
	id            atomic.Pointer[uuid.UUID]
	held, release chan struct{}
}

func newEndHold(t *testing.T) *endHold {
	t.Helper()
	op, err := engine.NewOperation("quick", []engine.Step[int, int]{
		engine.ExternalStep("noop", func(context.Context, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	return &endHold{op: op, held: make(chan struct{}), release: make(chan struct{})}
}

// newEngine is an engine of cfg that runs the operation and holds its run.
func (h *endHold) newEngine(t *testing.T, pool *pgxpool.Pool, cfg engine.Config) *engine.Engine {
	t.Helper()
	cfg.Operations = []engine.Definition{h.op}
	cfg.Observer = &engine.Observer{RunEnded: func(_ context.Context, ev engine.OperationEvent, _ engine.RunEnd, _ error) {
		if id := h.id.Load(); id != nil && *id == ev.ID {
			close(h.held)
			<-h.release
		}
	}}
	e, err := engine.New(pool, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	return e
}

// nextStart waits until the held run is in RunEnded, starts the client's next
// operation while it is, and reports that start's error (nil once it ran).
func (h *endHold) nextStart(t *testing.T, e *engine.Engine) error {
	t.Helper()
	ctx := context.Background()
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held run never reached RunEnded")
	}
	next, err := engine.Start(ctx, e, h.op, "client", "k-2", 1, nil)
	close(h.release)
	if err != nil {
		return err
	}
	_, err = next.Wait(ctx)
	require.NoError(t, err)
	return nil
}

// TestRoomBeforeAnswer: a run gives its place in the process's bounds back
// before its starter hears that it ended, so that a client that starts its
// next operation at once is never refused for one that has ended.
func TestRoomBeforeAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
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
			h := newEndHold(t)
			e := h.newEngine(t, testdb.Pool(t), tc.cfg)
			s, err := engine.Start(ctx, e, h.op, "client", "k-1", 1, nil)
			require.NoError(t, err)
			h.id.Store(&s.ID)
			info, err := s.Wait(ctx)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, info.Status)
			require.NoError(t, h.nextStart(t, e), "a place held after the answer would refuse it: %v", tc.want)
		})
	}
}

// TestRoomBeforeAnswerResume: the same for a run on a River worker, whose
// place in its scope is the worker's: an operation started with StartTx, and
// its client's next start once Engine.Wait has answered.
func TestRoomBeforeAnswerResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	h := newEndHold(t)
	pool := testdb.Pool(t)
	e := h.newEngine(t, pool, engine.Config{MaxInFlightPerScope: 1})

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	s, err := engine.StartTx(ctx, tx, e, h.op, "client", "k-1", 1, nil)
	require.NoError(t, err)
	h.id.Store(&s.ID)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, e.StartWorkers(ctx))
	info, err := e.Wait(ctx, s.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.NoError(t, h.nextStart(t, e), "the worker's place held after the answer would refuse it")
}
