package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
)

// A first attempt goes on from the state as a resumed run would decode it from
// its checkpoint, whether the engine decodes it back after each step or keeps
// it (a state of values only): a string with invalid UTF-8 comes out of the
// checkpoint with U+FFFD in its place, and the next step's state shares
// nothing with the last step's.
func TestStateAfterStepIsTheCheckpoints(t *testing.T) {
	t.Parallel()
	pool := setupPool(t)
	ctx := context.Background()

	// What the second step saw, before anything encoded it again.
	seen := map[string]string{}

	type valueState struct {
		Name string
	}
	values, err := engine.NewOperation("values", []engine.Step[int, valueState]{
		engine.ExternalStep("set", func(ctx context.Context, _ engine.Attempt, _ int, s *valueState) error {
			s.Name = "a\xffb"
			return nil
		}),
		engine.ExternalStep("read", func(ctx context.Context, _ engine.Attempt, _ int, s *valueState) error {
			seen["values"] = s.Name
			return nil
		}),
	}, func(_ int, s *valueState) (string, error) { return s.Name, nil }, nil)
	require.NoError(t, err)

	// A state of values only with valid strings is copied, not decoded: the
	// next step's state shares nothing with the last step's either.
	var keptValues *valueState
	copied, err := engine.NewOperation("copied", []engine.Step[int, valueState]{
		engine.ExternalStep("set", func(ctx context.Context, _ engine.Attempt, _ int, s *valueState) error {
			s.Name, keptValues = "a\ufffdb", s
			return nil
		}),
		engine.ExternalStep("read", func(ctx context.Context, _ engine.Attempt, _ int, s *valueState) error {
			keptValues.Name = "changed after the checkpoint"
			seen["copied"] = s.Name
			return nil
		}),
	}, func(_ int, s *valueState) (string, error) { return s.Name, nil }, nil)
	require.NoError(t, err)

	type pointerState struct {
		Name *string
	}
	var kept *string
	pointers, err := engine.NewOperation("pointers", []engine.Step[int, pointerState]{
		engine.ExternalStep("set", func(ctx context.Context, _ engine.Attempt, _ int, s *pointerState) error {
			name := "a\xffb"
			s.Name, kept = &name, &name
			return nil
		}),
		engine.ExternalStep("read", func(ctx context.Context, _ engine.Attempt, _ int, s *pointerState) error {
			*kept = "changed after the checkpoint"
			seen["pointers"] = *s.Name
			return nil
		}),
	}, func(_ int, s *pointerState) (string, error) { return *s.Name, nil }, nil)
	require.NoError(t, err)

	e := idemflowtest.Engine(t, pool, nil, values, copied, pointers)
	for _, tc := range []struct {
		name   string
		start  func() (*engine.Started, error)
		result func(*engine.Info) (string, error)
	}{
		{"values", func() (*engine.Started, error) { return engine.Start(ctx, e, values, "c", "k", 1, nil) }, values.Result},
		{"copied", func() (*engine.Started, error) { return engine.Start(ctx, e, copied, "c", "k2", 1, nil) }, copied.Result},
		{"pointers", func() (*engine.Started, error) { return engine.Start(ctx, e, pointers, "c", "k3", 1, nil) }, pointers.Result},
	} {
		started, err := tc.start()
		require.NoError(t, err, tc.name)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status, tc.name)
		got, err := tc.result(info)
		require.NoError(t, err, tc.name)
		require.Equal(t, "a\ufffdb", got, tc.name)
		require.Equal(t, "a\ufffdb", seen[tc.name], tc.name)
	}
}
