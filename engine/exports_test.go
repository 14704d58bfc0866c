package engine_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestSmallExports: the exported helpers that the rest of the tests do not
// reach on their way.
func TestSmallExports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var seen uuid.UUID
	op, err := engine.NewOperation("exports", []engine.Step[int, int]{
		engine.TxStep("first", func(ctx context.Context, _ engine.Tx, _ int, _ *int) error {
			seen = engine.OperationID(ctx)
			return nil
		}, nil),
		engine.TxStep("second", func(context.Context, engine.Tx, int, *int) error { return nil }, nil),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	other, err := engine.NewOperation("other", []engine.Step[int, int]{
		engine.TxStep("only", func(context.Context, engine.Tx, int, *int) error { return nil }, nil),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	require.Equal(t, []string{"first", "second"}, op.StepNames())
	require.Equal(t, "exports", op.Name())
	require.True(t, e.Registered(op))
	require.False(t, e.Registered(other))
	_, err = engine.Start(ctx, e, other, "c", "k", 1, nil)
	require.ErrorIs(t, err, engine.ErrNotRegistered)
	require.NotNil(t, e.River())

	require.Equal(t, uuid.Nil, engine.OperationID(ctx), "outside a step")
	s, err := engine.Start(ctx, e, op, "c", "k", 7, nil)
	require.NoError(t, err)
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, s.ID, seen, "a step sees its operation's id")
	byKey, err := e.GetByKey(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, info.ID, byKey.ID)
	require.Len(t, byKey.Steps, 2)
	_, err = e.GetByKey(ctx, "c", "nope")
	require.ErrorIs(t, err, engine.ErrNotFound)
}
