package engine_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// BenchmarkInFlight measures what an operation costs the process while it is in
// flight: b.N operations are started, each of which commits its first step and
// then waits in its external step (as for a slow provider); with all of them
// waiting, it reports the goroutines, heap bytes and open files per operation.
//
//	go test ./engine -run '^$' -bench InFlight -benchtime 1000x
func BenchmarkInFlight(b *testing.B) {
	ctx := context.Background()
	pool := testdb.Pool(b)
	release := make(chan struct{})
	var waiting atomic.Int64
	op, err := engine.NewOperation("inflight", []engine.Step[int, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
			_, err := tx.Exec(ctx, "SELECT 1")
			return err
		}),
		engine.ExternalStep("call", func(ctx context.Context, _ engine.Attempt, _ int, _ *int) error {
			waiting.Add(1)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return in, nil }, nil)
	require.NoError(b, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, MaxInFlight: -1, Lease: time.Minute})
	require.NoError(b, err)
	b.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines, files := runtime.NumGoroutine(), openFiles()

	b.ResetTimer()
	started := make([]*engine.Started, b.N)
	for i := range b.N {
		s, err := engine.Start(ctx, e, op, "c", "k-"+strconv.Itoa(i), i, nil)
		require.NoError(b, err)
		started[i] = s
	}
	require.Eventually(b, func() bool { return waiting.Load() == int64(b.N) }, time.Minute, time.Millisecond)
	b.StopTimer()

	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	n := float64(b.N)
	b.ReportMetric(float64(runtime.NumGoroutine()-goroutines)/n, "goroutines/op")
	b.ReportMetric(float64(int64(during.HeapInuse)-int64(before.HeapInuse))/n, "heap-B/op")
	b.ReportMetric(float64(openFiles()-files)/n, "files/op")

	close(release)
	var wg sync.WaitGroup
	for _, s := range started {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.Wait(ctx)
		}()
	}
	wg.Wait()
}

func openFiles() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(entries)
}
