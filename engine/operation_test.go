package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

func TestDefinition(t *testing.T) {
	t.Parallel()
	noop := func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error { return nil }
	call := func(context.Context, engine.Attempt, int, *int) error { return nil }
	result := func(in int, s *int) (int, error) { return 0, nil }

	tests := []struct {
		name  string
		steps []engine.Step[int, int]
		opts  *engine.OperationOpts
		want  string
	}{
		{"NoSteps", nil, nil, "has no steps"},
		{"DuplicateStep", []engine.Step[int, int]{engine.TxStep("a", noop), engine.TxStep("a", noop)}, nil, "duplicate step name"},
		{"EmptyStepName", []engine.Step[int, int]{engine.TxStep("", noop)}, nil, "has no name"},
		{"StepNameNotUTF8", []engine.Step[int, int]{engine.TxStep("a\xff", noop)}, nil, "is not UTF-8 without NUL"},
		{"StepNameWithNUL", []engine.Step[int, int]{engine.TxStep("a\x00b", noop)}, nil, "is not UTF-8 without NUL"},
		{"NilFunction", []engine.Step[int, int]{engine.TxStep[int, int]("a", nil)}, nil, "has no function"},
		{"NilExternalFunction", []engine.Step[int, int]{engine.ExternalStep[int, int]("a", nil)}, nil, "has no function"},
		{"NilStep", []engine.Step[int, int]{nil}, nil, "step 0 is nil"},
		{"BadFactor", []engine.Step[int, int]{engine.TxStep("a", noop)}, &engine.OperationOpts{Retry: engine.RetryPolicy{Factor: 0.5}}, "factor"},
		{"WindowShorterThanTimeout", []engine.Step[int, int]{engine.ExternalStep("pay", call).Window(10 * time.Millisecond).Timeout(time.Second)}, nil,
			"its outcome window (10ms) is shorter than its call timeout (1s)"},
		{"DefaultWindowShorterThanTimeout", []engine.Step[int, int]{engine.ExternalStep("pay", call).Timeout(defaultWindow + time.Second)}, nil,
			"is shorter than its call timeout"},
		{"NegativeTimeout", []engine.Step[int, int]{engine.ExternalStep("pay", call).Timeout(-time.Second)}, nil, "timeout must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := engine.NewOperation("op", tt.steps, result, tt.opts)
			require.ErrorContains(t, err, tt.want)
		})
	}

	t.Run("WindowAsLongAsTheTimeout", func(t *testing.T) {
		t.Parallel()
		_, err := engine.NewOperation("op", []engine.Step[int, int]{engine.ExternalStep("pay", call).Window(time.Second).Timeout(time.Second)}, result, nil)
		require.NoError(t, err)
	})

	t.Run("DuplicateOperation", func(t *testing.T) {
		t.Parallel()
		a, err := engine.NewOperation("same", []engine.Step[int, int]{engine.TxStep("a", noop)}, result, nil)
		require.NoError(t, err)
		b, err := engine.NewOperation("same", []engine.Step[int, int]{engine.TxStep("b", noop)}, result, nil)
		require.NoError(t, err)
		_, err = engine.New(nil, &engine.Config{Operations: []engine.Definition{a, b}})
		require.ErrorContains(t, err, "duplicate operation name")
	})
}

// fsNewOp declares a one-step operation over In, S and Out.
func fsNewOp[In, S, Out any]() error {
	_, err := engine.NewOperation("typed", []engine.Step[In, S]{
		engine.TxStep("only", func(context.Context, engine.Tx, engine.Attempt, In, *S) error { return nil }),
	}, func(In, *S) (Out, error) {
		var out Out
		return out, nil
	}, nil)
	return err
}

// fsRoles declares operations with T as the input, the state and the result.
func fsRoles[T any]() map[string]func() error {
	return map[string]func() error{
		"input":  fsNewOp[T, int, int],
		"state":  fsNewOp[int, T, int],
		"result": fsNewOp[int, int, T],
	}
}

type (
	fsBadUnexported struct {
		ID int `json:"id"`
		//lint:ignore U1000 the field encoding/json would drop is the point
		secret string
	}
	fsBadFunc struct {
		ID     int
		Notify func()
	}
	fsBadChan struct {
		Done chan int
	}
	fsBadComplex struct {
		Z complex128
	}
	fsBadMapKey struct {
		Rates map[float64]string
	}
	fsBadNested struct {
		Inner struct {
			Items []struct{ Phase complex128 }
		}
	}
	fsGoodInner struct {
		Name string     `json:"name"`
		When *time.Time `json:"when"`
	}
	fsGood struct {
		At      time.Time              `json:"at"`
		Raw     json.RawMessage        `json:"raw"`
		ID      uuid.UUID              `json:"id"`
		P       *int                   `json:"p"`
		PP      **string               `json:"pp"`
		Nested  fsGoodInner            `json:"nested"`
		NP      *fsGoodInner           `json:"np"`
		List    []fsGoodInner          `json:"list"`
		ByName  map[string]fsGoodInner `json:"byName"`
		ByID    map[int]string         `json:"byId"`
		Any     any                    `json:"any"`
		Skipped func()                 `json:"-"`
		fsGoodInner
	}
)

// TestNewOperationTypeChecks: NewOperation refuses an input, state or result
// type that does not survive encoding/json, naming the role and the field, and
// accepts the types that do.
func TestNewOperationTypeChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		roles map[string]func() error
		field string
	}{
		{"UnexportedField", fsRoles[fsBadUnexported](), "secret"},
		{"FuncField", fsRoles[fsBadFunc](), "Notify"},
		{"ChanField", fsRoles[fsBadChan](), "Done"},
		{"ComplexField", fsRoles[fsBadComplex](), "Z"},
		{"FloatMapKey", fsRoles[fsBadMapKey](), "Rates"},
		{"Nested", fsRoles[fsBadNested](), "Inner.Items[].Phase"},
	} {
		for role, newOp := range tc.roles {
			t.Run(tc.name+"/"+role, func(t *testing.T) {
				t.Parallel()
				err := newOp()
				require.Error(t, err)
				require.ErrorContains(t, err, role+" type")
				require.ErrorContains(t, err, "field "+tc.field+":")
			})
		}
	}
	for role, newOp := range fsRoles[fsGood]() {
		t.Run("Accepted/"+role, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, newOp())
		})
	}
	t.Run("AcceptedTopLevel", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, fsNewOp[time.Time, json.RawMessage, *fsGood]())
		require.NoError(t, fsNewOp[*int, []fsGoodInner, map[string]time.Time]())
	})
}
