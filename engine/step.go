package engine

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/reconcile"
)

// StepKind tells how the engine runs a step and checkpoints it.
type StepKind string

// txFunc is the body of a transactional step. It reads the operation's input and
// may change its state; its writes go through tx and commit with the checkpoint.
type txFunc[In, S any] func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error

// externalFunc is the body of an external step. It must pass at.Key to the
// outside service as the idempotency key of its request.
type externalFunc[In, S any] func(ctx context.Context, at Attempt, in In, state *S) error

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

// Step is one named step of an operation: a TxStepDef, an ExternalStepDef, a
// SignalStepDef, a TimerStepDef or an ApprovalStepDef, made with their
// functions.
type Step[In, S any] interface {
	// Name returns the step's name.
	Name() string
	spec() *stepSpec[In, S]
}

// stepSpec is what both kinds of step declare.
type stepSpec[In, S any] struct {
	name       string
	kind       StepKind
	tx         txFunc[In, S]
	external   externalFunc[In, S]
	lookup     func(ctx context.Context, at Attempt, in In, state *S) (bool, error)
	compensate func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error
	retry      RetryPolicy
	// settle is the step's outcome window; settleSet tells an explicit zero
	// from the default.
	settle    time.Duration
	settleSet bool
	// timeout bounds each call of an external step (zero: the engine sets
	// none).
	timeout   time.Duration
	resolve   func(in In, state *S, reference string) error
	reconcile func(in In, rec reconcile.Record) reconcile.Kind
	// source and reference: see ExternalStepDef.Records.
	source    string
	reference func(state *S) string
	// wait is a wait step's (SignalStep, TimerStep, ApprovalStep).
	wait *waitSpec[In, S]
}

// TxStepDef declares a transactional step. Make one with TxStep; its methods
// return a changed copy.
type TxStepDef[In, S any] struct{ s stepSpec[In, S] }

// TxStep declares a transactional step named name that runs fn.
func TxStep[In, S any](name string, fn func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error) TxStepDef[In, S] {
	return TxStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindTx, tx: fn}}
}

// Name returns the step's name.
func (d TxStepDef[In, S]) Name() string { return d.s.name }

// Compensate returns the step with fn as its compensation: what undoes it when a
// later step fails permanently. fn runs in a transaction that also records the
// compensation, so it takes effect once; at is the compensation's attempt, and
// its Key is the step's derived key.
func (d TxStepDef[In, S]) Compensate(fn func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error) TxStepDef[In, S] {
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
func ExternalStep[In, S any](name string, fn func(ctx context.Context, at Attempt, in In, state *S) error) ExternalStepDef[In, S] {
	return ExternalStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindExternal, external: fn}}
}

// Name returns the step's name.
func (d ExternalStepDef[In, S]) Name() string { return d.s.name }

// Lookup returns the step with fn as its lookup: what asks the outside service,
// by derived key, whether a lost attempt went through. Without one, an attempt
// whose outcome is unknown parks the operation (see the package documentation,
// "Failure").
//
// fn asks about the earlier attempts made with at.Key. When one went through,
// fn fills state as the step would have and returns true: the step is
// checkpointed without a new call. False with a nil error means that the
// service has nothing under the key. Two errors are answers too: one that
// of Accepted says that the service has the call
// but no final outcome yet (it is still processing, or accepted it as
// pending), and a *PermanentError from Fail says that the call ended without
// effect (a pending payout that failed): the step fails with it. Any other
// error is a lookup that could not answer.
func (d ExternalStepDef[In, S]) Lookup(fn func(ctx context.Context, at Attempt, in In, state *S) (bool, error)) ExternalStepDef[In, S] {
	d.s.lookup = fn
	return d
}

// Compensate returns the step with fn as its compensation: what undoes it when a
// later step fails permanently. An external step without one is a point of no
// return (a pivot). fn runs as TxStepDef.Compensate's does.
func (d ExternalStepDef[In, S]) Compensate(fn func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error) ExternalStepDef[In, S] {
	d.s.compensate = fn
	return d
}

// Retries returns the step with p as its retry policy; p's zero fields keep the
// operation's values (OperationOpts.Retry).
func (d ExternalStepDef[In, S]) Retries(p RetryPolicy) ExternalStepDef[In, S] {
	d.s.retry = p
	return d
}

// Window returns the step with window as its outcome window: the longest time the
// outside service may take to carry out a request after it was sent, so that
// a request that got no definite answer (a timeout, a lost connection, a 5xx,
// a crash mid-call) may land up to d after it. A lookup that finds nothing
// decides "not made" only once d has passed since the step's last request
// was sent; until then the step waits (see the package documentation,
// "Late and unknown outcomes"). A pending outcome that is not final after d
// makes the operation need attention, while it goes on waiting. Zero means
// that an answerless request never lands later: only for a service that
// guarantees it. Defaults to defaultWindow.
func (d ExternalStepDef[In, S]) Window(window time.Duration) ExternalStepDef[In, S] {
	d.s.settle, d.s.settleSet = window, true
	return d
}

// Timeout returns the step with d as the bound of each of its calls: the
// context its function gets ends d after the attempt began, and the attempt
// fails with the context's error then (an unknown outcome). The outcome window
// (Window, or its default of 5 minutes) must be at least d: NewOperation refuses a
// shorter one, since a request that timed out may still land after it. Zero,
// the default, sets no bound (the function's own client bounds its calls).
func (d ExternalStepDef[In, S]) Timeout(timeout time.Duration) ExternalStepDef[In, S] {
	d.s.timeout = timeout
	return d
}

// window is the step's outcome window, the default when Window was not called.
func (s *stepSpec[In, S]) window() time.Duration {
	if !s.settleSet {
		return defaultWindow
	}
	return s.settle
}

// FromReference returns the step with fn as what records, in the state, a call that
// an operator says was made, under the outside service's reference (see
// Engine.Resolve). Without one, an operator's "made" leaves the state as the
// step's lookup, or else the step before it, left it. fn records the call as
// the step itself would have, from the reference for what it made (a
// provider's refund id); it returns an error for a reference it cannot take (a
// malformed id), and the resolve is refused.
func (d ExternalStepDef[In, S]) FromReference(fn func(in In, state *S, reference string) error) ExternalStepDef[In, S] {
	d.s.resolve = fn
	return d
}

// Compare returns the step with fn as what compares a record of the outside
// service under the step's derived key with the operation's input, once the
// step succeeded (see Engine.Reconcile): an amount or an order that is not
// what was asked. Without one, reconciliation checks only that the record and
// the step agree on whether the call was carried out. fn returns the kind of
// mismatch, or "" when the record and the input agree.
func (d ExternalStepDef[In, S]) Compare(fn func(in In, rec reconcile.Record) reconcile.Kind) ExternalStepDef[In, S] {
	d.s.reconcile = fn
	return d
}

// Records returns the step with source as the reconciliation source
// (reconcile.Source.Name) that lists the records its calls make, and
// reference as what reads, from the operation's state after the step, the
// source's reference for what it made (a provider's refund id), whoever
// recorded it: its call, its lookup, an event or an operator (through
// Engine.Resolve). reference may be nil, and may return "" for a state that holds
// none.
//
// Reconciliation then looks both ways (see Engine.Reconcile): a succeeded
// step whose derived key the source does not list is reconcile.MissingRecord,
// and one whose reference is not the record's is reconcile.ReferenceDiffers.
// Without Records, a step is only judged from the records listed under its
// key, and its reference only when an operator gave it. An engine without
// the source (reconcile.Config.Sources) checks nothing the other way, and
// still compares the reference with the records that another source lists
// under the step's key.
func (d ExternalStepDef[In, S]) Records(source string, reference func(state *S) string) ExternalStepDef[In, S] {
	d.s.source, d.s.reference = source, reference
	return d
}

func (d ExternalStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }

type stepDef struct {
	name       string
	kind       StepKind
	tx         func(ctx context.Context, tx Tx, at Attempt, in, state any) error
	external   func(ctx context.Context, at Attempt, in, state any) error
	lookup     func(ctx context.Context, at Attempt, in, state any) (bool, error)
	compensate func(ctx context.Context, tx Tx, at Attempt, in, state any) error
	retry      RetryPolicy
	// settle is an external step's outcome window (see ExternalStepDef.Window).
	settle time.Duration
	// timeout bounds each call (ExternalStepDef.Timeout); zero: no bound.
	timeout time.Duration
	// resolve records an operator's reference in the state (ExternalStepDef.FromReference).
	resolve func(in, state any, reference string) error
	// reconcile compares a record with the input (ExternalStepDef.Compare).
	reconcile func(in any, rec reconcile.Record) reconcile.Kind
	// source lists the step's records, and reference reads the reference it
	// recorded from the state after it (ExternalStepDef.Records).
	source    string
	reference func(state any) string
	// wait is what a wait step waits for.
	wait *waitDef
}

// pivot reports whether the step is a point of no return: it calls out and
// cannot be undone. Once one has succeeded, its operation only goes forward.
func (s *stepDef) pivot() bool { return s.kind == StepKindExternal && s.compensate == nil }

// The kinds of step.
const (
	// StepKindTx is a step that writes to the database: its writes and its checkpoint
	// commit in one transaction, so it takes effect exactly once.
	StepKindTx StepKind = "tx"
	// StepKindExternal is a step that calls something outside the database. It gets a
	// derived idempotency key, the same on every attempt, and its result is
	// checkpointed as soon as it returns.
	StepKindExternal StepKind = "external"
	// StepKindWait is a step that waits for a signal, a moment or operators'
	// approvals (SignalStep, TimerStep, ApprovalStep), with no process busy on
	// it meanwhile.
	StepKindWait StepKind = "wait"
)
