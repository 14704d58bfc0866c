package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
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
		require.Equal(t, 1, info.Runs, "the job's run is the first")
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
		engine.TxStep("ledger", ledger),
		engine.TxStep("finalize", finalize),
	}, func(in transferIn, s *transferState) (transferOut, error) { return transferOut(*s), nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{v2}, SweepInterval: 50 * time.Millisecond, Lease: time.Second})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	// It never fails or compensates the operation, nor runs any of its steps:
	// it leaves it in progress, needing attention, for a process that can.
	var info *engine.Info
	require.Eventually(t, func() bool {
		info, err = e.Get(ctx, started.ID)
		require.NoError(t, err)
		return info.Attention != nil
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.True(t, info.NeedsAttention())
	require.Equal(t, engine.CodeDefinitionChanged, info.Attention.Code)
	require.Contains(t, info.Attention.Reason, `missing ["payout"]`)
	require.Equal(t, books{}, readBooks(t, pool), "nothing ran")

	// A process with the old definition finishes it, once its turn comes.
	require.NoError(t, e.Stop(ctx))
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() WHERE id = $1`, started.ID)
	require.NoError(t, err)
	back := idemflowtest.Engine(t, pool, nil, b.transferOp(t, engine.RetryPolicy{}))
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err = back.Wait(wctx, started.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.Nil(t, info.Attention)
}
