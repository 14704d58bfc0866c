package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/steps/outbox"
)

type notifyArgs struct {
	Key    string `json:"key"`
	Amount int64  `json:"amount"`
}

func (notifyArgs) Kind() string { return "notify" }

type payIn struct{ Amount int64 }
type payState struct{ Entry string }

func ledger(ctx context.Context, tx engine.Tx, at engine.Attempt, in payIn, s *payState) error {
	s.Entry = at.Key
	_, err := tx.Exec(ctx, "INSERT INTO outbox_ledger (entry, amount) VALUES ($1, $2)", at.Key, in.Amount)
	return err
}

func notify(at engine.Attempt, in payIn, s *payState) ([]river.InsertManyParams, error) {
	return []river.InsertManyParams{{Args: notifyArgs{Key: s.Entry, Amount: in.Amount}}}, nil
}

func setup(t *testing.T) (*pgxpool.Pool, *river.Client[pgx.Tx]) {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), "CREATE TABLE outbox_ledger (entry text PRIMARY KEY, amount bigint NOT NULL)")
	require.NoError(t, err)
	// Insert-only: no queues, no workers.
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	require.NoError(t, err)
	return pool, client
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), sql).Scan(&n))
	return n
}

// TestOutbox: the job commits with the step's writes, once, whatever the step's
// failed attempts inserted before.
func TestOutbox(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		steps func(client *river.Client[pgx.Tx]) []engine.Step[payIn, payState]
		// failing is the step whose first attempt fails after its effect.
		failing string
	}{
		{"With", func(c *river.Client[pgx.Tx]) []engine.Step[payIn, payState] {
			return []engine.Step[payIn, payState]{engine.TxStep("ledger", outbox.With(ledger, c, notify))}
		}, "ledger"},
		{"Step", func(c *river.Client[pgx.Tx]) []engine.Step[payIn, payState] {
			return []engine.Step[payIn, payState]{engine.TxStep("ledger", ledger), outbox.Step("notify", c, notify)}
		}, "notify"},
		{"Insert", func(c *river.Client[pgx.Tx]) []engine.Step[payIn, payState] {
			return []engine.Step[payIn, payState]{engine.TxStep("ledger", func(ctx context.Context, tx engine.Tx, at engine.Attempt, in payIn, s *payState) error {
				if err := ledger(ctx, tx, at, in, s); err != nil {
					return err
				}
				_, err := outbox.Insert(ctx, tx, c, notifyArgs{Key: s.Entry, Amount: in.Amount}, nil)
				return err
			})}
		}, "ledger"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool, client := setup(t)
			op, err := engine.NewOperation("pay", tt.steps(client),
				func(in payIn, s *payState) (string, error) { return s.Entry, nil },
				&engine.OperationOpts{Retry: engine.RetryPolicy{Base: time.Millisecond}})
			require.NoError(t, err)
			e, err := engine.New(pool, &engine.Config{
				Operations: []engine.Definition{op},
				Faults: engine.Faults{Hook: func(_ context.Context, ev faults.Event) error {
					if ev.Step == tt.failing && ev.Point == faults.PointAfterEffect && ev.Attempt == 1 {
						return errors.New("injected failure after the effect")
					}
					return nil
				}},
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

			started, err := engine.Start(ctx, e, op, "c", "k", payIn{Amount: 70}, nil)
			require.NoError(t, err)
			info, err := started.Wait(ctx)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, info.Status)

			require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_ledger"))
			require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM river_job WHERE kind = 'notify'"),
				"the failed attempt's job rolled back with its writes")
			var key string
			var amount int64
			require.NoError(t, pool.QueryRow(ctx, "SELECT args->>'key', (args->>'amount')::bigint FROM river_job WHERE kind = 'notify'").Scan(&key, &amount))
			require.Equal(t, int64(70), amount)
			var entry string
			require.NoError(t, pool.QueryRow(ctx, "SELECT entry FROM outbox_ledger").Scan(&entry))
			require.Equal(t, entry, key, "the job carries the step's derived key")

			got, err := e.Get(ctx, info.ID)
			require.NoError(t, err)
			for _, s := range got.Steps {
				if s.Name == tt.failing {
					require.Equal(t, 2, s.Attempts)
				}
			}
		})
	}
}
