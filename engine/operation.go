package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/google/uuid"
)

// StepKind tells how the engine runs a step and checkpoints it.
type StepKind string

// The kinds of step.
const (
	// KindTx is a step that writes to the database: its writes and its checkpoint
	// commit in one transaction, so it takes effect exactly once.
	KindTx StepKind = "tx"
	// KindExternal is a step that calls something outside the database. It gets a
	// derived idempotency key, the same on every attempt, and its result is
	// checkpointed as soon as it returns.
	KindExternal StepKind = "external"
)

// TxFunc is the body of a transactional step. It reads the operation's input and
// may change its state; its writes go through tx and commit with the checkpoint.
type TxFunc[In, S any] func(ctx context.Context, tx Tx, in In, state *S) error

// ExternalFunc is the body of an external step. It must pass call.Key to the
// outside service as the idempotency key of its request.
type ExternalFunc[In, S any] func(ctx context.Context, call Call, in In, state *S) error

// LookupFunc asks the outside service whether an earlier attempt of an external
// step, made with call.Key, went through. When it did, the function fills state as
// the step would have and returns true: the step is checkpointed without a new call.
type LookupFunc[In, S any] func(ctx context.Context, call Call, in In, state *S) (bool, error)

// CompensateFunc undoes a succeeded step when a later step fails permanently. It
// runs in a transaction that also records the compensation, so it takes effect
// once.
type CompensateFunc[In, S any] func(ctx context.Context, tx Tx, in In, state *S) error

// Call describes one attempt of an external step.
type Call struct {
	// Key is the derived idempotency key: the same for every attempt of this step
	// of this operation, in every process, and unknown to anyone without the
	// database (see the package documentation, "Derived keys").
	Key string
	// Attempt counts the attempts of this step, from 1.
	Attempt int
	// OperationID is the id of the operation the step belongs to.
	OperationID uuid.UUID
	// Operation, Step, Scope and OperationKey identify the step.
	Operation    string
	Step         string
	Scope        string
	OperationKey string
}

// Step is one named step of an operation. Make one with TxStep or ExternalStep.
type Step[In, S any] struct {
	name       string
	kind       StepKind
	tx         TxFunc[In, S]
	external   ExternalFunc[In, S]
	lookup     LookupFunc[In, S]
	compensate CompensateFunc[In, S]
	retry      RetryPolicy
}

// StepOpts are the optional parts of a step.
type StepOpts[In, S any] struct {
	// Retry overrides the operation's retry policy for this step; zero fields
	// keep the operation's values.
	Retry RetryPolicy
	// Compensate undoes the step when a later step fails permanently.
	Compensate CompensateFunc[In, S]
	// Lookup, for an external step only, asks whether a lost attempt went through.
	Lookup LookupFunc[In, S]
}

// TxStep declares a transactional step named name. opts may be nil.
func TxStep[In, S any](name string, fn TxFunc[In, S], opts *StepOpts[In, S]) Step[In, S] {
	s := Step[In, S]{name: name, kind: KindTx, tx: fn}
	s.applyOpts(opts)
	return s
}

// ExternalStep declares a step named name that calls an outside service with a
// derived idempotency key. opts may be nil.
func ExternalStep[In, S any](name string, fn ExternalFunc[In, S], opts *StepOpts[In, S]) Step[In, S] {
	s := Step[In, S]{name: name, kind: KindExternal, external: fn}
	s.applyOpts(opts)
	return s
}

func (s *Step[In, S]) applyOpts(opts *StepOpts[In, S]) {
	if opts == nil {
		return
	}
	s.retry = opts.Retry
	s.compensate = opts.Compensate
	s.lookup = opts.Lookup
}

// RetryPolicy says how often and how fast a step that failed transiently is tried
// again. Attempt n (n >= 2) starts Base * Factor^(n-2) after attempt n-1 failed,
// at most Cap.
type RetryPolicy struct {
	// Base is the delay before the second attempt. Defaults to 1 second.
	Base time.Duration
	// Factor multiplies the delay after each attempt. Defaults to 2.
	Factor float64
	// Cap bounds the delay. Defaults to 5 minutes.
	Cap time.Duration
	// MaxAttempts is the number of attempts after which a step that still fails
	// transiently fails the operation. Defaults to 10.
	MaxAttempts int
}

// The defaults of RetryPolicy.
const (
	DefaultRetryBase        = time.Second
	DefaultRetryFactor      = 2.0
	DefaultRetryCap         = 5 * time.Minute
	DefaultRetryMaxAttempts = 10
)

// merged returns p with its zero fields taken from fallback.
func (p RetryPolicy) merged(fallback RetryPolicy) RetryPolicy {
	if p.Base == 0 {
		p.Base = fallback.Base
	}
	if p.Factor == 0 {
		p.Factor = fallback.Factor
	}
	if p.Cap == 0 {
		p.Cap = fallback.Cap
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = fallback.MaxAttempts
	}
	return p
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	return p.merged(RetryPolicy{
		Base:        DefaultRetryBase,
		Factor:      DefaultRetryFactor,
		Cap:         DefaultRetryCap,
		MaxAttempts: DefaultRetryMaxAttempts,
	})
}

func (p RetryPolicy) validate() error {
	switch {
	case p.Base < 0:
		return errors.New("retry base must not be negative")
	case p.Factor != 0 && p.Factor < 1:
		return errors.New("retry factor must be at least 1")
	case p.Cap < 0:
		return errors.New("retry cap must not be negative")
	case p.MaxAttempts < 0:
		return errors.New("retry max attempts must not be negative")
	}
	return nil
}

// Backoff returns the delay after failed attempt number attempt (from 1) before
// the next one.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.withDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.Base) * math.Pow(p.Factor, float64(attempt-1))
	if d > float64(p.Cap) || math.IsInf(d, 0) || math.IsNaN(d) {
		return p.Cap
	}
	return time.Duration(d)
}

// OperationOpts are the optional parts of an operation.
type OperationOpts struct {
	// Retry is the retry policy of the operation's steps. Zero fields take the
	// defaults (see RetryPolicy).
	Retry RetryPolicy
	// Retention is how long a finished operation of this type, and so its key and
	// stored answer, is kept. Zero takes Config.Retention.
	Retention time.Duration
	// Unfingerprinted are top-level fields of the input (by their JSON names)
	// that do not take part in its fingerprint: a Start under a held key whose
	// input differs from the first only in these fields is the same start, not
	// a reused key (see Start).
	Unfingerprinted []string
}

// Operation is an operation type: a name, an ordered list of uniquely named steps
// over an input In and a state S, and the final result Out built from them. It is
// immutable once made, and safe for concurrent use.
type Operation[In, S, Out any] struct {
	name      string
	steps     []Step[In, S]
	result    func(in In, state *S) (Out, error)
	retry     RetryPolicy
	retention time.Duration
	ignore    []string
	erased    *opDef
}

// NewOperation declares an operation type. result builds the final result from the
// input and the state after the last step; it runs in the transaction that stores
// the result, and an error from it fails the operation for good. opts may be nil.
//
// It returns an error when the name is empty, there are no steps, a step name is
// empty or repeated, a lookup is declared on a transactional step, or In, S or
// Out would not survive encoding/json (the engine keeps them as JSON and decodes
// them on every resume): a field that is unexported, a func, a channel or a
// complex number, or a map whose keys encoding/json cannot write. The error
// names the field.
func NewOperation[In, S, Out any](name string, steps []Step[In, S], result func(in In, state *S) (Out, error), opts *OperationOpts) (*Operation[In, S, Out], error) {
	if opts == nil {
		opts = &OperationOpts{}
	}
	if name == "" {
		return nil, errors.New("engine: operation name is empty")
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("engine: operation %q has no steps", name)
	}
	if result == nil {
		return nil, fmt.Errorf("engine: operation %q has no result function", name)
	}
	if err := opts.Retry.validate(); err != nil {
		return nil, fmt.Errorf("engine: operation %q: %w", name, err)
	}
	if opts.Retention < 0 {
		return nil, fmt.Errorf("engine: operation %q: retention must not be negative", name)
	}
	for _, t := range []struct {
		role string
		typ  reflect.Type
	}{
		{"input", reflect.TypeFor[In]()},
		{"state", reflect.TypeFor[S]()},
		{"result", reflect.TypeFor[Out]()},
	} {
		if err := checkJSONType(t.typ); err != nil {
			return nil, fmt.Errorf("engine: operation %q: %s type %s: %w", name, t.role, t.typ, err)
		}
	}
	seen := make(map[string]bool, len(steps))
	for i, s := range steps {
		switch {
		case s.name == "":
			return nil, fmt.Errorf("engine: operation %q: step %d has no name", name, i)
		case seen[s.name]:
			return nil, fmt.Errorf("engine: operation %q: %w: %q", name, ErrDuplicateStep, s.name)
		case s.kind == KindTx && s.tx == nil, s.kind == KindExternal && s.external == nil, s.kind == "":
			return nil, fmt.Errorf("engine: operation %q: step %q has no function", name, s.name)
		case s.kind == KindTx && s.lookup != nil:
			return nil, fmt.Errorf("engine: operation %q: step %q: a lookup is for external steps only", name, s.name)
		}
		if err := s.retry.validate(); err != nil {
			return nil, fmt.Errorf("engine: operation %q: step %q: %w", name, s.name, err)
		}
		seen[s.name] = true
	}
	op := &Operation[In, S, Out]{
		name:      name,
		steps:     append([]Step[In, S](nil), steps...),
		result:    result,
		retry:     opts.Retry.withDefaults(),
		retention: opts.Retention,
		ignore:    slices.Clone(opts.Unfingerprinted),
	}
	op.erased = op.erase()
	return op, nil
}

// Name returns the operation type's name.
func (op *Operation[In, S, Out]) Name() string { return op.name }

// StepNames returns the names of the operation's steps, in order.
func (op *Operation[In, S, Out]) StepNames() []string {
	names := make([]string, len(op.steps))
	for i, s := range op.steps {
		names[i] = s.name
	}
	return names
}

// Result decodes the result of a succeeded operation of this type.
func (op *Operation[In, S, Out]) Result(info *Info) (Out, error) {
	var out Out
	if info == nil || info.Status != StatusSucceeded {
		return out, fmt.Errorf("engine: operation has no result: %w", ErrNotSucceeded)
	}
	if err := json.Unmarshal(info.Result, &out); err != nil {
		return out, fmt.Errorf("engine: decode result of %q: %w", op.name, err)
	}
	return out, nil
}

func (op *Operation[In, S, Out]) definition() *opDef { return op.erased }

// Definition is an operation type whatever its type parameters: what Config takes.
// Every *Operation is one.
type Definition interface {
	Name() string
	definition() *opDef
}

// opDef is an operation type with its types erased, which is what the runner and
// the River workers work with.
type opDef struct {
	name      string
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
	decodeInput func(raw []byte) (any, error)
	result      func(in, state any) ([]byte, error)
}

type stepDef struct {
	name       string
	kind       StepKind
	tx         func(ctx context.Context, tx Tx, in, state any) error
	external   func(ctx context.Context, call Call, in, state any) error
	lookup     func(ctx context.Context, call Call, in, state any) (bool, error)
	compensate func(ctx context.Context, tx Tx, in, state any) error
	retry      RetryPolicy
}

// pivot reports whether the step is a point of no return: it calls out and
// cannot be undone. Once one has succeeded, its operation only goes forward.
func (s *stepDef) pivot() bool { return s.kind == KindExternal && s.compensate == nil }

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
		retention: op.retention,
		ignore:    op.ignore,
		index:     make(map[string]int, len(op.steps)),
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
		sd := &stepDef{name: s.name, kind: s.kind, retry: s.retry.merged(op.retry)}
		if s.tx != nil {
			fn := s.tx
			sd.tx = func(ctx context.Context, tx Tx, in, state any) error { return fn(ctx, tx, in.(In), state.(*S)) }
		}
		if s.external != nil {
			fn := s.external
			sd.external = func(ctx context.Context, call Call, in, state any) error { return fn(ctx, call, in.(In), state.(*S)) }
		}
		if s.lookup != nil {
			fn := s.lookup
			sd.lookup = func(ctx context.Context, call Call, in, state any) (bool, error) {
				return fn(ctx, call, in.(In), state.(*S))
			}
		}
		if s.compensate != nil {
			fn := s.compensate
			sd.compensate = func(ctx context.Context, tx Tx, in, state any) error { return fn(ctx, tx, in.(In), state.(*S)) }
		}
		d.steps = append(d.steps, sd)
		d.names = append(d.names, s.name)
		d.index[s.name] = i
	}
	return d
}

type operationIDKey struct{}

// OperationID returns the id of the operation whose step runs with ctx, for a step
// that records it beside its own rows. It returns uuid.Nil outside a step.
func OperationID(ctx context.Context) uuid.UUID {
	id, _ := ctx.Value(operationIDKey{}).(uuid.UUID)
	return id
}
