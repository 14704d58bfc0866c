package engine_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestPgxTx: the step's transaction as a pgx.Tx writes with the step and its
// checkpoint, and cannot be ended by the step.
func TestPgxTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE pgxtx_rows (n int)")
	require.NoError(t, err)
	var commitErr, rollbackErr, atCommitErr error
	var sameTx bool
	op, err := engine.NewOperation("pgxtx", []engine.Step[int, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, _ *int) error {
			ptx, err := engine.PgxTx(ctx, tx)
			if err != nil {
				return err
			}
			if _, err := ptx.Exec(ctx, "INSERT INTO pgxtx_rows VALUES ($1)", in); err != nil {
				return err
			}
			commitErr, rollbackErr = ptx.Commit(ctx), ptx.Rollback(ctx)
			_, atCommitErr = engine.PgxTx(ctx, engine.AtCommit(tx))
			// Statements through tx and through the pgx.Tx share the transaction.
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM pgxtx_rows").Scan(&n); err != nil {
				return err
			}
			sameTx = n == 1
			return nil
		}),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	started, err := engine.Start(ctx, e, op, "c", "k", 5, nil)
	require.NoError(t, err)
	info, err := started.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.ErrorContains(t, commitErr, "committed or rolled back by the engine")
	require.ErrorContains(t, rollbackErr, "committed or rolled back by the engine")
	require.Error(t, atCommitErr)
	require.True(t, sameTx)
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pgxtx_rows WHERE n = 5").Scan(&n))
	require.Equal(t, 1, n)

	// A pgx.Tx, in a step's own test, is given back as it is.
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err := engine.PgxTx(ctx, tx)
		require.NoError(t, err)
		require.Equal(t, tx, got)
		return nil
	}))
}
