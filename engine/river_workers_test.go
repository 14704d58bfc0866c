package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

type appArgs struct{ N int }

func (appArgs) Kind() string { return "app_job" }

type appWorker struct {
	river.WorkerDefaults[appArgs]
	done chan int
}

func (w *appWorker) Work(_ context.Context, job *river.Job[appArgs]) error {
	w.done <- job.Args.N
	return nil
}

// TestRiverWorkers: the application's workers and queues run on the engine's
// River client.
func TestRiverWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	w := &appWorker{done: make(chan int, 1)}
	e, err := engine.New(pool, &engine.Config{
		River: engine.RiverConfig{Workers: func(_ *engine.Engine, ws *river.Workers) error { return river.AddWorkerSafely(ws, w) },
			Queues: map[string]river.QueueConfig{"app": {MaxWorkers: 2}}},
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	_, err = e.River().Insert(ctx, appArgs{N: 7}, &river.InsertOpts{Queue: "app"})
	require.NoError(t, err)
	select {
	case n := <-w.done:
		require.Equal(t, 7, n)
	case <-time.After(30 * time.Second):
		t.Fatal("the application's job was not worked")
	}

	_, err = engine.New(pool, &engine.Config{River: engine.RiverConfig{Queues: map[string]river.QueueConfig{defaultQueue: {MaxWorkers: 1}}}})
	require.ErrorContains(t, err, "the engine's own queue")
}
