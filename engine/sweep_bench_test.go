package engine_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// BenchmarkSweepWaiting measures one sweep of a process that runs versions 1 of
// "ver" and of nine other types, while operations of "ver" version 2 (which it
// does not run) wait with expired leases: the cost must not grow with them.
//
//	go test ./engine -run '^$' -bench SweepWaiting -benchtime 200x
func BenchmarkSweepWaiting(b *testing.B) {
	for _, waiting := range []int{0, 1_000, 100_000} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) {
			ctx := context.Background()
			pool := testdb.Pool(b)
			_, err := pool.Exec(ctx, `
				INSERT INTO idemflow_operation (id, name, version, scope, key, steps, input, locked_until, format)
				SELECT gen_random_uuid(), 'ver', 2, 'c', 'k' || g, '{a,b,c}', '1', now() - interval '1 hour', 2
				FROM generate_series(1, $1) AS g`, waiting)
			require.NoError(b, err)
			for _, sql := range []string{"VACUUM ANALYZE idemflow_operation", "CHECKPOINT"} {
				_, err = pool.Exec(ctx, sql)
				require.NoError(b, err)
			}
			noop := func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }
			result := func(in int, _ *int) (int, error) { return in, nil }
			var defs []engine.Definition
			for i := range 10 {
				name := "ver"
				if i > 0 {
					name = fmt.Sprintf("other%d", i)
				}
				op, err := engine.NewOperation(name, []engine.Step[int, int]{engine.TxStep("a", noop)}, result, nil)
				require.NoError(b, err)
				defs = append(defs, op)
			}
			e, err := engine.New(pool, &engine.Config{Operations: defs})
			require.NoError(b, err)
			b.Cleanup(func() { _ = e.Stop(context.Background()) })
			b.ResetTimer()
			for range b.N {
				if err := e.Sweep(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
