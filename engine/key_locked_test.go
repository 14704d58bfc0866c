package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestStartWhileTheKeysRowIsLocked: a retry whose reservation waits out
// lock_timeout on the key's row, because a transaction is writing that row (as
// the run that holds the operation does), gets the answer that a taken key gets,
// from the row as committed: the operation, or ReusedError for another input. A
// start that waits on another start's reservation that has not committed yet
// gets errUnavailable. Neither reserves anything.
func TestStartWhileTheKeysRowIsLocked(t *testing.T) {
	t.Parallel()
	// Bounded: without the lock timeout, a start would wait out its lease.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testdb.Pool(t).Config().Copy()
	engine.BoundPool(c, &engine.PoolOpts{LockTimeout: 50 * time.Millisecond})
	pool, err := pgxpool.NewWithConfig(ctx, c)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	op, err := engine.NewOperation("locked", []engine.Step[int, int]{
		engine.ExternalStep("call", func(_ context.Context, _ engine.Attempt, in int, s *int) error {
			*s = in
			return nil
		}),
	}, func(_ int, s *int) (int, error) { return *s, nil }, nil)
	require.NoError(t, err)
	// What RunEnded hears of the retries' runs: the reservation's lock wait.
	ended := make(chan error, 8)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, Observer: &engine.Observer{
		RunEnded: func(_ context.Context, _ engine.OperationEvent, end engine.RunEnd, err error) {
			if end == engine.RunKeyTaken {
				err = fmt.Errorf("%s: %w", end, err)
			}
			if err != nil {
				ended <- err
			}
		},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })
	requireLockWait := func(t *testing.T) error {
		t.Helper()
		err := <-ended
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the run ended on the reservation's lock wait")
		require.EqualValues(t, "55P03", pgErr.Code)
		return err
	}

	first, err := engine.Start(ctx, e, op, "c", "k1", 1, nil)
	require.NoError(t, err)
	done, err := first.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, done.Status)

	t.Run("RowBeingWritten", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		tag, err := tx.Exec(ctx, `UPDATE idemflow_operation SET runs = runs WHERE id = $1`, first.ID)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())

		again, err := engine.Start(ctx, e, op, "c", "k1", 1, nil)
		require.NoError(t, err, "a retry while the key's row is written is answered from the committed row")
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, engine.StatusSucceeded, again.Existing.Status)
		require.JSONEq(t, `1`, string(again.Existing.Result))
		require.ErrorContains(t, requireLockWait(t), string(engine.RunKeyTaken), "RunEnded hears of a key taken")

		_, err = engine.Start(ctx, e, op, "c", "k1", 2, nil)
		require.ErrorAs(t, err, new(*engine.ReusedError), "another input is refused as ever")
		require.ErrorContains(t, requireLockWait(t), string(engine.RunKeyTaken))
	})

	t.Run("ReservationNotCommitted", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		other, err := engine.StartTx(ctx, tx, e, op, "c", "k2", 2, nil)
		require.NoError(t, err)
		require.True(t, other.Created)

		_, err = engine.Start(ctx, e, op, "c", "k2", 2, nil)
		require.True(t, engine.IsUnavailable(err), "nothing committed holds the key yet: retry: %v", err)
		require.True(t, engine.IsUnavailable(err))
		require.NotContains(t, requireLockWait(t).Error(), string(engine.RunKeyTaken))
		require.NoError(t, tx.Rollback(ctx))

		started, err := engine.Start(ctx, e, op, "c", "k2", 2, nil)
		require.NoError(t, err)
		require.True(t, started.Created, "the start that waited reserved nothing")
		info, err := started.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation WHERE key = 'k2'`).Scan(&n))
		require.Equal(t, 1, n)
	})
}
