package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/idemflow/idemflow/reconcile"
)

// Definition is an operation type whatever its type parameters: what Config takes.
// Every *Operation is one.
type Definition interface {
	Name() string
	Version() int
	definition() *opDef
}

// opDef is an operation type with its types erased, which is what the runner and
// the River workers work with.
type opDef struct {
	name      string
	version   int
	retention time.Duration
	// ignore are the input's unfingerprinted fields.
	ignore []string
	steps  []*stepDef
	// names are the steps' names, in order.
	names []string
	index map[string]int
	// decodeState returns a fresh *S, filled from a checkpoint when raw is not
	// empty. Like decodeInput it refuses fields that the type lacks (a field
	// renamed by a deploy), which would otherwise decode silently to nothing.
	decodeState func(raw []byte) (any, error)
	// reloadState and reloadInput decode what this process has just encoded
	// from the same types, which has no fields the types lack: plain
	// json.Unmarshal, cheaper than the strict decoder.
	reloadState func(raw []byte) (any, error)
	reloadInput func(raw []byte) (any, error)
	// stateValueOnly is true when the state's type is made of values only (see
	// valueOnlyJSON): a run copies the state it encoded rather than decode it
	// back, which gives an equal value. copyState returns a new *S holding a
	// copy of *S, which is all of it for such a type.
	stateValueOnly bool
	copyState      func(state any) any
	decodeInput    func(raw []byte) (any, error)
	result         func(in, state any) ([]byte, error)
	// window is the longest outcome window of its external steps (nil: none).
	window *time.Duration
}

// settleWindow is the longest outcome window of the definition's external
// steps, nil when none calls out.
func (d *opDef) settleWindow() *time.Duration { return d.window }

func (d *opDef) longestSettle() *time.Duration {
	var w *time.Duration
	for _, st := range d.steps {
		if st.kind == StepKindExternal && (w == nil || st.settle > *w) {
			settle := st.settle
			w = &settle
		}
	}
	return w
}

// cannotUndo reports whether the step named name commits its operation to going
// forward once it succeeded: a pivot, or a step this definition lacks, which
// nobody here can tell apart from one.
func (d *opDef) cannotUndo(name string) bool {
	i, ok := d.index[name]
	return !ok || d.steps[i].pivot()
}

// decodeStrict decodes raw into v, refusing fields that v's type lacks.
func decodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}

func (op *Operation[In, S, Out]) erase() *opDef {
	d := &opDef{
		name:      op.name,
		version:   op.version,
		retention: op.retention,
		ignore:    op.ignore,
		index:     make(map[string]int, len(op.steps)),

		stateValueOnly: valueOnlyJSON(reflect.TypeFor[S]()),
		copyState: func(state any) any {
			c := *state.(*S)
			return &c
		},
		decodeState: func(raw []byte) (any, error) {
			s := new(S)
			if len(raw) == 0 {
				return s, nil
			}
			if err := decodeStrict(raw, s); err != nil {
				return nil, fmt.Errorf("decode state: %w", err)
			}
			return s, nil
		},
		decodeInput: func(raw []byte) (any, error) {
			var in In
			if err := decodeStrict(raw, &in); err != nil {
				return nil, fmt.Errorf("decode input: %w", err)
			}
			return in, nil
		},
		reloadState: func(raw []byte) (any, error) {
			s := new(S)
			if err := json.Unmarshal(raw, s); err != nil {
				return nil, fmt.Errorf("decode state: %w", err)
			}
			return s, nil
		},
		reloadInput: func(raw []byte) (any, error) {
			var in In
			if err := json.Unmarshal(raw, &in); err != nil {
				return nil, fmt.Errorf("decode input: %w", err)
			}
			return in, nil
		},
		result: func(in, state any) ([]byte, error) {
			out, err := op.result(in.(In), state.(*S))
			if err != nil {
				return nil, err
			}
			return json.Marshal(out)
		},
	}
	for i, s := range op.steps {
		sd := &stepDef{name: s.name, kind: s.kind, retry: s.retry.merged(op.retry), settle: s.window(), timeout: s.timeout}
		if s.tx != nil {
			fn := s.tx
			sd.tx = func(ctx context.Context, tx Tx, at Attempt, in, state any) error {
				return fn(ctx, tx, at, in.(In), state.(*S))
			}
		}
		if s.external != nil {
			fn := s.external
			sd.external = func(ctx context.Context, at Attempt, in, state any) error { return fn(ctx, at, in.(In), state.(*S)) }
		}
		if s.lookup != nil {
			fn := s.lookup
			sd.lookup = func(ctx context.Context, at Attempt, in, state any) (bool, error) {
				return fn(ctx, at, in.(In), state.(*S))
			}
		}
		if s.resolve != nil {
			fn := s.resolve
			sd.resolve = func(in, state any, reference string) error { return fn(in.(In), state.(*S), reference) }
		}
		if s.reconcile != nil {
			fn := s.reconcile
			sd.reconcile = func(in any, rec reconcile.Record) reconcile.Kind { return fn(in.(In), rec) }
		}
		sd.source = s.source
		if s.wait != nil {
			sd.wait = s.wait.erase()
		}
		if s.reference != nil {
			fn := s.reference
			sd.reference = func(state any) string { return fn(state.(*S)) }
		}
		if s.compensate != nil {
			fn := s.compensate
			sd.compensate = func(ctx context.Context, tx Tx, at Attempt, in, state any) error {
				return fn(ctx, tx, at, in.(In), state.(*S))
			}
		}
		d.steps = append(d.steps, sd)
		d.names = append(d.names, s.name)
		d.index[s.name] = i
	}
	d.window = d.longestSettle()
	return d
}
