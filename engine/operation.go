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
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// StepKind tells how the engine runs a step and checkpoints it.
type StepKind string

// The kinds of step.
const (
	// StepKindTx is a step that writes to the database: its writes and its checkpoint
	// commit in one transaction, so it takes effect exactly once.
	StepKindTx StepKind = "tx"
	// StepKindExternal is a step that calls something outside the database. It gets a
	// derived idempotency key, the same on every attempt, and its result is
	// checkpointed as soon as it returns.
	StepKindExternal StepKind = "external"
)

// TxFunc is the body of a transactional step. It reads the operation's input and
// may change its state; its writes go through tx and commit with the checkpoint.
type TxFunc[In, S any] func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error

// ExternalFunc is the body of an external step. It must pass at.Key to the
// outside service as the idempotency key of its request.
type ExternalFunc[In, S any] func(ctx context.Context, at Attempt, in In, state *S) error

// LookupFunc asks the outside service whether an earlier attempt of an external
// step, made with at.Key, went through. When it did, the function fills state as
// the step would have and returns true: the step is checkpointed without a new call.
// False with a nil error means that the service has nothing under the key.
// Two errors are answers too: one that matches ErrOutcomePending (see Pending) says
// that the service has the call but no final outcome yet (it is still
// processing, or accepted it as pending), and a *PermanentError from Fail
// says that the call ended without effect (a pending payout that failed):
// the step fails with it. Any other error is a lookup that could not answer.
type LookupFunc[In, S any] func(ctx context.Context, at Attempt, in In, state *S) (bool, error)

// CompensateFunc undoes a succeeded step when a later step fails permanently. It
// runs in a transaction that also records the compensation, so it takes effect
// once. at is the compensation's attempt; its Key is the step's derived key.
type CompensateFunc[In, S any] func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error

// Attempt describes one attempt of a step, of any kind, or of its compensation or
// lookup.
type Attempt struct {
	// Key is the step's derived idempotency key: the same for every attempt of
	// this step of this operation, in every process, and unknown to anyone
	// without the database (see the package documentation, "Derived keys"). An
	// external step passes it to the outside service; a transactional step may
	// record it as a reference unique to the step.
	Key string
	// Number counts the attempts of the step (or of its compensation), from 1.
	Number int
	// OperationID is the id of the operation the step belongs to.
	OperationID uuid.UUID
	// Operation, Step, Scope and OperationKey identify the step.
	Operation    string
	Step         string
	Scope        string
	OperationKey string
}

// Step is one named step of an operation: a TxStepDef or an ExternalStepDef, made
// with TxStep or ExternalStep.
type Step[In, S any] interface {
	// Name returns the step's name.
	Name() string
	spec() *stepSpec[In, S]
}

// stepSpec is what both kinds of step declare.
type stepSpec[In, S any] struct {
	name       string
	kind       StepKind
	tx         TxFunc[In, S]
	external   ExternalFunc[In, S]
	lookup     LookupFunc[In, S]
	compensate CompensateFunc[In, S]
	retry      RetryPolicy
	// settle is the step's settle window; settleSet tells an explicit zero
	// from the default.
	settle    time.Duration
	settleSet bool
	resolve   ResolveFunc[In, S]
	reconcile ReconcileFunc[In]
}

// TxStepDef declares a transactional step. Make one with TxStep; its methods
// return a changed copy.
type TxStepDef[In, S any] struct{ s stepSpec[In, S] }

// TxStep declares a transactional step named name that runs fn.
func TxStep[In, S any](name string, fn TxFunc[In, S]) TxStepDef[In, S] {
	return TxStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindTx, tx: fn}}
}

// Name returns the step's name.
func (d TxStepDef[In, S]) Name() string { return d.s.name }

// Compensate returns the step with fn as its compensation: what undoes it when a
// later step fails permanently.
func (d TxStepDef[In, S]) Compensate(fn CompensateFunc[In, S]) TxStepDef[In, S] {
	d.s.compensate = fn
	return d
}

// Retries returns the step with p as its retry policy; p's zero fields keep the
// operation's values (OperationOpts.Retry).
func (d TxStepDef[In, S]) Retries(p RetryPolicy) TxStepDef[In, S] {
	d.s.retry = p
	return d
}

func (d TxStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }

// ExternalStepDef declares a step that calls an outside service with a derived
// idempotency key. Make one with ExternalStep; its methods return a changed copy.
type ExternalStepDef[In, S any] struct{ s stepSpec[In, S] }

// ExternalStep declares an external step named name that runs fn.
func ExternalStep[In, S any](name string, fn ExternalFunc[In, S]) ExternalStepDef[In, S] {
	return ExternalStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindExternal, external: fn}}
}

// Name returns the step's name.
func (d ExternalStepDef[In, S]) Name() string { return d.s.name }

// Lookup returns the step with fn as its lookup: what asks the outside service,
// by derived key, whether a lost attempt went through. Without one, an attempt
// whose outcome is unknown parks the operation (see the package documentation,
// "Failure").
func (d ExternalStepDef[In, S]) Lookup(fn LookupFunc[In, S]) ExternalStepDef[In, S] {
	d.s.lookup = fn
	return d
}

// Compensate returns the step with fn as its compensation: what undoes it when a
// later step fails permanently. An external step without one is a point of no
// return (a pivot).
func (d ExternalStepDef[In, S]) Compensate(fn CompensateFunc[In, S]) ExternalStepDef[In, S] {
	d.s.compensate = fn
	return d
}

// Retries returns the step with p as its retry policy; p's zero fields keep the
// operation's values (OperationOpts.Retry).
func (d ExternalStepDef[In, S]) Retries(p RetryPolicy) ExternalStepDef[In, S] {
	d.s.retry = p
	return d
}

// Settle returns the step with d as its settle window: the longest time the
// outside service may take to carry out a request after it was sent, so that
// a request that got no definite answer (a timeout, a lost connection, a 5xx,
// a crash mid-call) may land up to d after it. A lookup that finds nothing
// decides "not made" only once d has passed since the step's last request
// was sent; until then the step waits (see the package documentation,
// "Late and unknown outcomes"). A pending outcome that is not final after d
// makes the operation need attention, while it goes on waiting. Zero means
// that an answerless request never lands later: only for a service that
// guarantees it. Defaults to DefaultSettle.
func (d ExternalStepDef[In, S]) Settle(window time.Duration) ExternalStepDef[In, S] {
	d.s.settle, d.s.settleSet = window, true
	return d
}

// Resolve returns the step with fn as what records, in the state, a call that
// an operator says was made, under the outside service's reference (see
// Engine.Resolve). Without one, an operator's "made" leaves the state as the
// step's lookup, or else the step before it, left it.
func (d ExternalStepDef[In, S]) Resolve(fn ResolveFunc[In, S]) ExternalStepDef[In, S] {
	d.s.resolve = fn
	return d
}

// Reconcile returns the step with fn as what compares a record of the outside
// service under the step's derived key with the operation's input, once the
// step succeeded (see Engine.Reconcile): an amount or an order that is not
// what was asked. Without one, reconciliation checks only that the record and
// the step agree on whether the call was carried out.
func (d ExternalStepDef[In, S]) Reconcile(fn ReconcileFunc[In]) ExternalStepDef[In, S] {
	d.s.reconcile = fn
	return d
}

// DefaultSettle is the settle window of an external step that does not set one.
const DefaultSettle = 5 * time.Minute

func (d ExternalStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }

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
	// transiently fails the operation; it bounds an external step's calls:
	// out of attempts, an external step whose outcome is unknown sends
	// nothing more and only asks its lookup until the outcome is known (see
	// ExternalStepDef.Settle). An attempt of a transactional step that failed
	// because the database did not answer (IsUnavailable) does not count.
	// Defaults to 10.
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
	// Version is the version of the operation type's definition, from 1 (zero
	// means 1). An operation runs on the version it started with, always; a
	// process may register several versions of one name (see the package
	// documentation, "Versions").
	Version int
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
	steps     []stepSpec[In, S]
	result    func(in In, state *S) (Out, error)
	retry     RetryPolicy
	retention time.Duration
	version   int
	ignore    []string
	erased    *opDef
}

// NewOperation declares an operation type. result builds the final result from the
// input and the state after the last step; it runs in the transaction that stores
// the result, and an error from it fails the operation for good. opts may be nil.
//
// It returns an error when the name is empty, there are no steps, a step name is
// empty or repeated, a step has no function, or In, S or
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
	version := opts.Version
	if version == 0 {
		version = 1
	}
	if version < 0 {
		return nil, fmt.Errorf("engine: operation %q: version must be at least 1", name)
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
	specs := make([]stepSpec[In, S], len(steps))
	for i, step := range steps {
		if step == nil {
			return nil, fmt.Errorf("engine: operation %q: step %d is nil", name, i)
		}
		s := *step.spec()
		switch {
		case s.name == "":
			return nil, fmt.Errorf("engine: operation %q: step %d has no name", name, i)
		case !utf8.ValidString(s.name) || strings.ContainsRune(s.name, 0):
			// PostgreSQL's text, which records it, holds neither.
			return nil, fmt.Errorf("engine: operation %q: step %d's name %q is not UTF-8 without NUL", name, i, s.name)
		case seen[s.name]:
			return nil, fmt.Errorf("engine: operation %q: %w: %q", name, ErrDuplicateStep, s.name)
		case s.kind == StepKindTx && s.tx == nil, s.kind == StepKindExternal && s.external == nil, s.kind == "":
			return nil, fmt.Errorf("engine: operation %q: step %q has no function", name, s.name)
		}
		if err := s.retry.validate(); err != nil {
			return nil, fmt.Errorf("engine: operation %q: step %q: %w", name, s.name, err)
		}
		if s.settle < 0 {
			return nil, fmt.Errorf("engine: operation %q: step %q: settle window must not be negative", name, s.name)
		}
		seen[s.name] = true
		specs[i] = s
	}
	op := &Operation[In, S, Out]{
		name:      name,
		steps:     specs,
		result:    result,
		retry:     opts.Retry.withDefaults(),
		retention: opts.Retention,
		version:   version,
		ignore:    slices.Clone(opts.Unfingerprinted),
	}
	op.erased = op.erase()
	return op, nil
}

// Name returns the operation type's name.
func (op *Operation[In, S, Out]) Name() string { return op.name }

// Version returns the version of the operation type's definition.
func (op *Operation[In, S, Out]) Version() int { return op.version }

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
}

type stepDef struct {
	name       string
	kind       StepKind
	tx         func(ctx context.Context, tx Tx, at Attempt, in, state any) error
	external   func(ctx context.Context, at Attempt, in, state any) error
	lookup     func(ctx context.Context, at Attempt, in, state any) (bool, error)
	compensate func(ctx context.Context, tx Tx, at Attempt, in, state any) error
	retry      RetryPolicy
	// settle is an external step's settle window (see ExternalStepDef.Settle).
	settle time.Duration
	// resolve records an operator's reference in the state (ExternalStepDef.Resolve).
	resolve func(in, state any, reference string) error
	// reconcile compares a record with the input (ExternalStepDef.Reconcile).
	reconcile func(in any, rec Record) MismatchKind
}

// pivot reports whether the step is a point of no return: it calls out and
// cannot be undone. Once one has succeeded, its operation only goes forward.
func (s *stepDef) pivot() bool { return s.kind == StepKindExternal && s.compensate == nil }

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
		sd := &stepDef{name: s.name, kind: s.kind, retry: s.retry.merged(op.retry), settle: s.settle}
		if !s.settleSet {
			sd.settle = DefaultSettle
		}
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
			sd.reconcile = func(in any, rec Record) MismatchKind { return fn(in.(In), rec) }
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
	return d
}
