package engine_test

import (
	"context"
	"strings"
	"testing"

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
	var seen engine.Attempt
	op, err := engine.NewOperation("exports", []engine.Step[int, int]{
		engine.TxStep("first", func(_ context.Context, _ engine.Tx, at engine.Attempt, _ int, _ *int) error {
			seen = at
			return nil
		}),
		engine.TxStep("second", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	other, err := engine.NewOperation("other", []engine.Step[int, int]{
		engine.TxStep("only", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, _ *int) (int, error) { return in, nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.WithoutCancel(ctx)) })

	require.Equal(t, "exports", op.Name())
	require.True(t, e.Registered(op))
	require.False(t, e.Registered(other))
	_, err = engine.Start(ctx, e, other, "c", "k", 1, nil)
	require.ErrorContains(t, err, "operation type not registered")
	require.NotNil(t, e.River())

	s, err := engine.Start(ctx, e, op, "c", "k", 7, nil)
	require.NoError(t, err)
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, s.ID, seen.OperationID, "a transactional step sees its attempt")
	require.Equal(t, 1, seen.Number)
	require.Equal(t, "exports", seen.Operation)
	require.Equal(t, "first", seen.Step)
	require.Equal(t, "c", seen.Scope)
	require.Equal(t, "k", seen.OperationKey)
	require.True(t, strings.HasPrefix(seen.Key, "idf3_"), seen.Key)
	byKey, err := e.GetByKey(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, info.ID, byKey.ID)
	require.Len(t, byKey.Steps, 2)
	_, err = e.GetByKey(ctx, "c", "nope")
	require.ErrorIs(t, err, engine.ErrNotFound)
}
