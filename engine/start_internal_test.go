package engine

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
)

// TestExistingOutlivesTheRunsContext: a first attempt whose reservation found
// the key taken just as its run's context ended (its reservation had not
// committed within the lease, errLeaseExpiring) still reads the operation that
// holds the key for its starter, rather than answer the context's end (which
// an HTTP layer answered 500); one deleted since is errUnavailable.
func TestExistingOutlivesTheRunsContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op, err := NewOperation("held", []Step[int, int]{
		ExternalStep("call", func(context.Context, Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := New(testdb.Pool(t), &Config{Operations: []Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })
	first, err := Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	_, err = first.Wait(ctx)
	require.NoError(t, err)

	def, p, err := e.prepare(op, "c", "k", 1, nil)
	require.NoError(t, err)
	r := &run{e: e, def: def, scope: "c", key: "k", fp: p.fp}
	r.insert = p.insert(uuid.Must(uuid.NewV7()), newKeySecret(), e.cfg.Lease)
	runCtx, cancel := context.WithCancelCause(ctx)
	cancel(errLeaseExpiring)

	res := r.existing(runCtx, nil)
	require.NoError(t, res.err)
	require.Equal(t, first.ID, res.existing.ID)
	require.Equal(t, StatusSucceeded, res.existing.Status)

	// Another input is refused as ever.
	_, p, err = e.prepare(op, "c", "k", 2, nil)
	require.NoError(t, err)
	r.fp, r.insert = p.fp, p.insert(uuid.Must(uuid.NewV7()), newKeySecret(), e.cfg.Lease)
	require.ErrorAs(t, r.existing(runCtx, nil).err, new(*ReusedError))

	// Deleted since (as the retention job does): the key is free again, and a
	// retry reserves it.
	_, err = e.pool.Exec(ctx, `DELETE FROM idemflow_operation WHERE id = $1`, first.ID)
	require.NoError(t, err)
	err = r.existing(runCtx, nil).err
	require.ErrorIs(t, err, errUnavailable)
	require.True(t, IsUnavailable(err))
}
