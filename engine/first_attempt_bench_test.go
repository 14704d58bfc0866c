package engine_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

type benchIn struct {
	Client  string `json:"client"`
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
}

type benchState struct {
	RefundID         string `json:"refundId"`
	ProviderRefundID string `json:"providerRefundId"`
}

// BenchmarkFirstAttempt runs first attempts of an operation shaped as the
// refund (a transactional step, a call, a transactional step, each step's
// write sent with its commit), one at a time, and reports the allocations
// per operation: the engine's own Go work and pgx's, without a provider;
// with and without StartOpts.Wait.
//
//	go test ./engine -run '^$' -bench FirstAttempt -benchmem -benchtime 2000x
func BenchmarkFirstAttempt(b *testing.B) {
	ctx := context.Background()
	pool := testdb.Pool(b)
	_, err := pool.Exec(ctx, `CREATE TABLE bench_write (id text PRIMARY KEY, n bigint NOT NULL)`)
	require.NoError(b, err)
	op, err := engine.NewOperation("first", []engine.Step[benchIn, benchState]{
		engine.TxStep("ledger", func(ctx context.Context, tx engine.Tx, at engine.Attempt, in benchIn, s *benchState) error {
			s.RefundID = "re_" + at.OperationID.String()
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO bench_write (id, n) VALUES ($1, $2)`, s.RefundID, in.Amount)
			return err
		}),
		engine.ExternalStep("provider", func(_ context.Context, at engine.Attempt, _ benchIn, s *benchState) error {
			s.ProviderRefundID = "pr_" + at.Key[:12]
			return nil
		}),
		engine.TxStep("finalize", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ benchIn, s *benchState) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `UPDATE bench_write SET n = n + 1 WHERE id = $1`, s.RefundID)
			return err
		}),
	}, func(_ benchIn, s *benchState) (benchState, error) { return *s, nil }, nil)
	require.NoError(b, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(b, err)
	b.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	for _, bc := range []struct {
		name string
		opts *engine.StartOpts
	}{
		{"Start", nil},
		{"StartWait", &engine.StartOpts{Wait: time.Minute}}, // woken once, with the answer
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			prefix := uuid.NewString() // each run's keys its own
			for i := range b.N {
				k := prefix + "-" + strconv.Itoa(i)
				s, err := engine.Start(ctx, e, op, "c", k, benchIn{Client: "c", OrderID: k, Amount: 100}, bc.opts)
				require.NoError(b, err)
				info, err := s.Wait(ctx)
				require.NoError(b, err)
				require.Equal(b, engine.StatusSucceeded, info.Status)
			}
		})
	}
}
