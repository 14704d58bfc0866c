package engine

import (
	"context"
	"encoding/json"
	"time"
)

// WaitReason says what a step that waits with no process busy on it waits
// for (StepInfo.Wait, Observer.Waited, the waiting gauges).
type WaitReason string

// What a step waits for.
const (
	// WaitOutcome: an external step waits for the outside service's word on
	// its call (see the package documentation, "Late and unknown outcomes").
	WaitOutcome WaitReason = "outcome"
	// WaitSignal: a SignalStep waits for its signal (Engine.Signal).
	WaitSignal WaitReason = "signal"
	// WaitTimer: a TimerStep waits for its moment.
	WaitTimer WaitReason = "timer"
	// WaitApproval: an ApprovalStep waits for operators' approvals
	// (Engine.Approve, Engine.Reject).
	WaitApproval WaitReason = "approval"
)

// Deadline is a moment a wait ends at: At when it is set, else After past
// the moment its step is reached, by the database's clock. The zero
// Deadline is none. It is fixed when the step is reached: what the
// definition returns later changes nothing for an operation that got there.
type Deadline struct {
	At    time.Time
	After time.Duration
}

// IsZero reports whether d is no deadline.
func (d Deadline) IsZero() bool { return d.At.IsZero() && d.After == 0 }

// Signal is a message to an operation, which a SignalStep waiting for its
// Name applies (Engine.Signal sends one).
type Signal struct {
	// ID names the signal: an operation keeps each ID once, so that a
	// signal sent twice is applied once. Required.
	ID string
	// Name is what a SignalStep waits for. Required; names that begin with
	// "idemflow." are the engine's own.
	Name string
	// Payload is the signal's content, JSON (may be nil).
	Payload json.RawMessage
	// ReceivedAt is when the operation's database kept it; set on the
	// signals a step gets.
	ReceivedAt time.Time
}

// signalFunc applies a signal to an operation: it runs in the transaction
// that checkpoints its step, as a transactional step does.
type signalFunc[In, S any] func(ctx context.Context, tx Tx, at Attempt, in In, state *S, sig Signal) error

// ApprovalPolicy is what an ApprovalStep asks of an operation: how many
// distinct actors must approve it (zero: none, the step passes at once), and
// when the wait expires (the zero Deadline: never).
type ApprovalPolicy struct {
	Need    int
	Expires Deadline
}

// waitDef is what a step that waits for a signal, a moment or approvals
// declares, with its types erased.
type waitDef struct {
	reason WaitReason
	// signal is the signal it waits for (approvals: signalApprove).
	signal string
	// until returns its deadline (a timer's moment), need the approvals it
	// needs; both from the input and the state when it is reached.
	until func(in, state any) Deadline
	need  func(in, state any) int
	// apply applies the signal; timeout runs when the deadline passes
	// first (nil: the step fails with timeoutCode).
	apply   func(ctx context.Context, tx Tx, at Attempt, in, state any, sig Signal) error
	timeout func(ctx context.Context, tx Tx, at Attempt, in, state any) error
	// rejected and expired are the codes of an approval step's failures.
	rejected, expired string
}

// The signals of approvals: a signal's id is its actor's, so that an actor
// counts once.
const (
	signalApprove = "idemflow.approve"
	signalReject  = "idemflow.reject"
)

// waitSpec is what a wait step declares, typed.
type waitSpec[In, S any] struct {
	reason   WaitReason
	signal   string
	until    func(in In, state *S) Deadline
	policy   func(in In, state *S) ApprovalPolicy
	apply    signalFunc[In, S]
	timeout  txFunc[In, S]
	rejected string
	expired  string
}

// erase returns the wait with its types erased.
func (w *waitSpec[In, S]) erase() *waitDef {
	d := &waitDef{reason: w.reason, signal: w.signal, rejected: w.rejected, expired: w.expired}
	switch {
	case w.policy != nil:
		p := w.policy
		d.until = func(in, state any) Deadline { return p(in.(In), state.(*S)).Expires }
		d.need = func(in, state any) int { return p(in.(In), state.(*S)).Need }
	case w.until != nil:
		u := w.until
		d.until = func(in, state any) Deadline { return u(in.(In), state.(*S)) }
	}
	if w.apply != nil {
		fn := w.apply
		d.apply = func(ctx context.Context, tx Tx, at Attempt, in, state any, sig Signal) error {
			return fn(ctx, tx, at, in.(In), state.(*S), sig)
		}
	}
	if w.timeout != nil {
		fn := w.timeout
		d.timeout = func(ctx context.Context, tx Tx, at Attempt, in, state any) error {
			return fn(ctx, tx, at, in.(In), state.(*S))
		}
	}
	return d
}

// SignalStepDef declares a step that waits for a signal. Make one with
// SignalStep; its methods return a changed copy.
type SignalStepDef[In, S any] struct{ s stepSpec[In, S] }

// SignalStep declares a step named name that waits for the signal named
// signal to its operation (Engine.Signal), with no goroutine, lease or River
// job busy meanwhile, and applies the first one with fn, in the transaction
// that checkpoints the step. A signal sent before the step is reached waits
// for it. An error from fn fails the attempt as a TxStep's does.
func SignalStep[In, S any](name, signal string, fn func(ctx context.Context, tx Tx, at Attempt, in In, state *S, sig Signal) error) SignalStepDef[In, S] {
	return SignalStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindWait,
		wait: &waitSpec[In, S]{reason: WaitSignal, signal: signal, apply: fn}}}
}

// Name returns the step's name.
func (d SignalStepDef[In, S]) Name() string { return d.s.name }

// Deadline returns the step with a deadline, fixed when the step is reached
// from what when returns: once it passes by the database's clock with no
// signal kept, onTimeout runs in the transaction that checkpoints the step,
// exactly once, by whichever process is up (or the first to start after it).
// A nil onTimeout fails the step, and the operation, with CodeSignalTimeout.
// A signal that comes after the deadline is refused (ErrWaitOver): the first
// to commit, the signal or the deadline, wins.
func (d SignalStepDef[In, S]) Deadline(when func(in In, state *S) Deadline, onTimeout func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error) SignalStepDef[In, S] {
	w := *d.s.wait
	w.until, w.timeout = when, onTimeout
	d.s.wait = &w
	return d
}

// Compensate returns the step with fn as its compensation, as
// TxStepDef.Compensate.
func (d SignalStepDef[In, S]) Compensate(fn func(ctx context.Context, tx Tx, at Attempt, in In, state *S) error) SignalStepDef[In, S] {
	d.s.compensate = fn
	return d
}

// Retries returns the step with p as the retry policy of its signal
// function's failures.
func (d SignalStepDef[In, S]) Retries(p RetryPolicy) SignalStepDef[In, S] {
	d.s.retry = p
	return d
}

func (d SignalStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }

// TimerStepDef declares a durable timer. Make one with TimerStep.
type TimerStepDef[In, S any] struct{ s stepSpec[In, S] }

// TimerStep declares a step named name that waits until the moment that
// when returns, fixed when the step is reached (a Deadline's At, or After
// past then), with no goroutine, lease or River job busy meanwhile. It
// passes exactly once, by whichever process is up at the moment, or the first
// to start after it. A moment in the past, or the zero Deadline, passes at
// once.
func TimerStep[In, S any](name string, when func(in In, state *S) Deadline) TimerStepDef[In, S] {
	return TimerStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindWait,
		wait: &waitSpec[In, S]{reason: WaitTimer, until: when}}}
}

// Name returns the step's name.
func (d TimerStepDef[In, S]) Name() string { return d.s.name }

func (d TimerStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }

// ApprovalStepDef declares a step that waits for operators' approvals. Make
// one with ApprovalStep; its methods return a changed copy.
type ApprovalStepDef[In, S any] struct{ s stepSpec[In, S] }

// ApprovalStep declares a step named name that waits until the number of
// distinct actors that policy asks for approved the operation
// (Engine.Approve; an actor counts once), or one rejected it
// (Engine.Reject), each with a reason. The number and the expiry are fixed
// and stored when the step is reached. A rejection fails the step with
// CodeRejected, and an expiry with CodeApprovalExpired: business failures,
// which compensate the steps before it, as a decline does. While it waits,
// the operation is in progress, needs no attention, and no process is busy on
// it; Engine.Approvals lists it.
func ApprovalStep[In, S any](name string, policy func(in In, state *S) ApprovalPolicy) ApprovalStepDef[In, S] {
	return ApprovalStepDef[In, S]{stepSpec[In, S]{name: name, kind: StepKindWait,
		wait: &waitSpec[In, S]{reason: WaitApproval, signal: signalApprove, policy: policy,
			rejected: string(CodeRejected), expired: string(CodeApprovalExpired)}}}
}

// Name returns the step's name.
func (d ApprovalStepDef[In, S]) Name() string { return d.s.name }

// Codes returns the step with rejected and expired as the codes its
// failures end the operation with (empty: the default's).
func (d ApprovalStepDef[In, S]) Codes(rejected, expired string) ApprovalStepDef[In, S] {
	w := *d.s.wait
	if rejected != "" {
		w.rejected = rejected
	}
	if expired != "" {
		w.expired = expired
	}
	d.s.wait = &w
	return d
}

func (d ApprovalStepDef[In, S]) spec() *stepSpec[In, S] { return &d.s }
