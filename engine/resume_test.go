package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

func TestStartTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CommitsWithCallerAndRunsOnWorker", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true})
		var started *engine.Started
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO test_ledger (account, amount, note) VALUES ('caller', 0, 'caller')`); err != nil {
				return err
			}
			var err error
			started, err = engine.StartTx(ctx, tx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
			return err
		}))
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)
		require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, b.pool))
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{workers: true})
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		started, err := engine.StartTx(ctx, tx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		_, err = e.Get(ctx, started.ID)
		require.ErrorIs(t, err, engine.ErrNotFound)

		// The key was never consumed.
		again, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 9}, nil)
		require.NoError(t, err)
		require.True(t, again.Created)
		waitDone(t, e, again)
	})
}

func TestVersioning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setupPool(t)
	b := &bundle{pool: pool}

	// A process with the old definition starts the operation, to run on a worker...
	v1 := b.transferOp(t, engine.RetryPolicy{})
	old, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v1}})
	require.NoError(t, err)
	var started *engine.Started
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		started, err = engine.StartTx(ctx, tx, old, v1, "c", "k", transferIn{From: "a", To: "b", Amount: 1}, nil)
		return err
	}))

	// ...and a process whose definition dropped the payout step picks it up.
	v2, err := engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("ledger", ledger, nil),
		engine.TxStep("finalize", finalize, nil),
	}, func(in transferIn, s *transferState) (transferOut, error) { return transferOut(*s), nil }, nil)
	require.NoError(t, err)
	e := newEngine(t, pool, v2)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := e.Wait(ctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.Equal(t, "definition_changed", info.Error.Code)
	require.Contains(t, info.Error.Message, `missing ["payout"]`)
	require.Equal(t, books{}, readBooks(t, pool), "nothing ran")
}
