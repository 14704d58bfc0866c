package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// OperationOpts are the optional parts of an operation.
type OperationOpts struct {
	// Retry is the retry policy of the operation's steps. Zero fields take the
	// defaults (see RetryPolicy).
	Retry RetryPolicy
	// Retention is how long a finished operation of this type, and so its key and
	// stored answer, is kept. Zero takes Config.Retention; Off keeps them for
	// ever.
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
	// signals are the steps that wait for each signal (approvals: theirs).
	signals := make(map[string]string)
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
			return nil, fmt.Errorf("engine: operation %q: %w: %q", name, errDuplicateStep, s.name)
		case s.kind == StepKindTx && s.tx == nil, s.kind == StepKindExternal && s.external == nil, s.kind == StepKindWait && s.wait == nil, s.kind == "":
			return nil, fmt.Errorf("engine: operation %q: step %q has no function", name, s.name)
		}
		if w := s.wait; w != nil {
			switch {
			case w.reason == WaitSignal && w.apply == nil, w.reason == WaitTimer && w.until == nil, w.reason == WaitApproval && w.policy == nil:
				return nil, fmt.Errorf("engine: operation %q: step %q has no function", name, s.name)
			case w.reason == WaitSignal && (w.signal == "" || strings.HasPrefix(w.signal, "idemflow.")):
				return nil, fmt.Errorf("engine: operation %q: step %q: the signal's name must not be empty nor begin with \"idemflow.\"", name, s.name)
			case signals[w.signal] != "":
				// One signal would decide both.
				return nil, fmt.Errorf("engine: operation %q: steps %q and %q wait for the same signal %q", name, signals[w.signal], s.name, w.signal)
			}
			if w.signal != "" {
				signals[w.signal] = s.name
			}
		}
		if err := s.retry.validate(); err != nil {
			return nil, fmt.Errorf("engine: operation %q: step %q: %w", name, s.name, err)
		}
		if s.settle < 0 {
			return nil, fmt.Errorf("engine: operation %q: step %q: outcome window must not be negative", name, s.name)
		}
		if s.timeout < 0 {
			return nil, fmt.Errorf("engine: operation %q: step %q: timeout must not be negative", name, s.name)
		}
		if settle := s.window(); s.timeout > 0 && settle < s.timeout {
			// A request that timed out may still land after such a window:
			// "not made" would be said of a call that may still be made.
			return nil, fmt.Errorf("engine: operation %q: step %q: its outcome window (%s) is shorter than its call timeout (%s)", name, s.name, settle, s.timeout)
		}
		seen[s.name] = true
		specs[i] = s
	}
	op := &Operation[In, S, Out]{
		name:      name,
		steps:     specs,
		result:    result,
		retry:     opts.Retry.withDefaults(),
		retention: retentionOf(opts.Retention),
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

// retentionOf is a retention as given, with Off (any negative value) for ever.
func retentionOf(d time.Duration) time.Duration {
	if d < 0 {
		return forever
	}
	return d
}
