package idemflowotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/engine"
)

// ScopeName is the instrumentation scope of the spans of Observer: the
// package's import path.
const ScopeName = "github.com/idemflow/idemflow/contrib/idemflowotel"

// The attributes of the spans and events, named after OpenTelemetry's
// conventions: one namespace for the library, no attribute named as a
// namespace (so idemflow.operation.name, not idemflow.operation).
const (
	attrOperationName    = attribute.Key("idemflow.operation.name")
	attrOperationVersion = attribute.Key("idemflow.operation.version")
	attrOperationID      = attribute.Key("idemflow.operation.id")
	attrOperationStatus  = attribute.Key("idemflow.operation.status")
	attrRunResumed       = attribute.Key("idemflow.run.resumed")
	attrRunEndReason     = attribute.Key("idemflow.run.end_reason")
	attrStepName         = attribute.Key("idemflow.step.name")
	attrStepAttempt      = attribute.Key("idemflow.step.attempt")
	attrStepDerivedKey   = attribute.Key("idemflow.step.derived_key")
	attrStepOutcome      = attribute.Key("idemflow.step.outcome")
	attrLookupFound      = attribute.Key("idemflow.lookup.found")
	attrWaitReason       = attribute.Key("idemflow.wait.reason")
	attrWaitDuration     = attribute.Key("idemflow.wait.duration")
)

// LookupEventName names the span event of a lookup by derived key.
const LookupEventName = "idemflow.lookup"

// WaitEventName names the span event of a wait step decided (a signal
// applied, a moment come, approved, rejected, expired): an event of the
// run's span.
const WaitEventName = "idemflow.wait"

// Opts are the optional parts of Observer.
type Opts struct {
	// OmitDerivedKey leaves idemflow.step.derived_key out of the step spans,
	// for a tracing backend that should not know the keys the outside
	// services are called with (the engine keeps them unguessable; see
	// engine's "Derived keys"). Defaults to false: the key is there, to find
	// an attempt's request in a provider's logs.
	OmitDerivedKey bool
}

// Observer returns an engine.Observer that records traces with tp: a span per
// run of an operation (idemflow.run/NAME, a child of the context the run
// begins with) and, under it, a span per attempt of a step
// (idemflow.step/STEP), whose context the step's function gets; lookups are
// events of the attempt's span, and a wait step decided an event of the
// run's. See the package documentation for the
// attributes and statuses.
//
// A nil tp gives a nil Observer, which engine.Observers leaves out: tracing is
// off. opts may be nil.
func Observer(tp trace.TracerProvider, opts *Opts) *engine.Observer {
	if tp == nil {
		return nil
	}
	o := Opts{}
	if opts != nil {
		o = *opts
	}
	t := &tracer{tracer: tp.Tracer(ScopeName), opts: o}
	return &engine.Observer{
		RunStarted:        t.runStarted,
		RunEnded:          t.runEnded,
		OperationFinished: t.operationFinished,
		StepStarted:       t.stepStarted,
		StepAttempted:     t.stepAttempted,
		LookedUp:          t.lookedUp,
		Waited:            t.waited,
	}
}

type tracer struct {
	tracer trace.Tracer
	opts   Opts
}

// runSpan is a run's span and the attempt's span still open in it. The
// engine calls an observer from the goroutine of the run only, so nothing
// guards it.
type runSpan struct {
	span trace.Span
	open *stepSpan
}

type stepSpan struct {
	span trace.Span
	run  *runSpan
}

type runKey struct{}

type stepKey struct{}

// The run's and the attempt's own spans are kept in the contexts under keys
// of this package's, so that another observer's span (engine.Observers) in the
// same context is never taken for them.
func runFrom(ctx context.Context) *runSpan {
	r, _ := ctx.Value(runKey{}).(*runSpan)
	return r
}

// stepFrom returns the attempt's span in ctx, when it belongs to the run in
// ctx (a step's function may start a run of its own: Engine.Cancel).
func stepFrom(ctx context.Context) *stepSpan {
	s, _ := ctx.Value(stepKey{}).(*stepSpan)
	if s == nil || s.run != runFrom(ctx) {
		return nil
	}
	return s
}

func operationAttrs(op engine.OperationEvent) []attribute.KeyValue {
	return []attribute.KeyValue{
		attrOperationName.String(op.Name),
		attrOperationVersion.Int(op.Version),
		attrOperationID.String(op.ID.String()),
	}
}

func (t *tracer) runStarted(ctx context.Context, op engine.OperationEvent, resumed bool) context.Context {
	ctx, span := t.tracer.Start(ctx, "idemflow.run/"+op.Name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(append(operationAttrs(op), attrRunResumed.Bool(resumed))...))
	return context.WithValue(ctx, runKey{}, &runSpan{span: span})
}

func (t *tracer) operationFinished(ctx context.Context, _ engine.OperationEvent, status engine.Status) {
	if r := runFrom(ctx); r != nil {
		r.span.SetAttributes(attrOperationStatus.String(string(status)))
	}
}

func (t *tracer) runEnded(ctx context.Context, _ engine.OperationEvent, end engine.RunEnd, err error) {
	r := runFrom(ctx)
	if r == nil {
		return
	}
	if r.open != nil {
		// An attempt that the engine ended without an outcome: the run
		// stopped in it (a first attempt whose key was taken, a lost lease, a
		// commit that failed).
		endWith(r.open.span, end, err)
		r.open = nil
	}
	endWith(r.span, end, err)
}

// endWith ends span with the status that a run's end calls for: an error
// for RunFailed, else, for a run that did not finish its operation, the end
// as idemflow.run.end_reason.
func endWith(span trace.Span, end engine.RunEnd, err error) {
	switch end {
	case engine.RunFailed:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case engine.RunFinished:
	default:
		span.SetAttributes(attrRunEndReason.String(string(end)))
	}
	span.End()
}

func (t *tracer) stepStarted(ctx context.Context, s engine.StepEvent) context.Context {
	r := runFrom(ctx)
	attrs := append(operationAttrs(s.Operation), attrStepName.String(s.Step), attrStepAttempt.Int(s.Attempt))
	if s.Key != "" && !t.opts.OmitDerivedKey {
		attrs = append(attrs, attrStepDerivedKey.String(s.Key))
	}
	ctx, span := t.tracer.Start(ctx, "idemflow.step/"+s.Step, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...))
	st := &stepSpan{span: span, run: r}
	if r != nil {
		r.open = st
	}
	return context.WithValue(ctx, stepKey{}, st)
}

func (t *tracer) stepAttempted(ctx context.Context, s engine.StepEvent) {
	st := stepFrom(ctx)
	if st == nil {
		return
	}
	st.span.SetAttributes(attrStepOutcome.String(string(s.Outcome)))
	// A pending answer is no failure: the call was accepted, and its outcome
	// comes later.
	if s.Outcome != engine.AttemptSucceeded && s.Outcome != engine.AttemptAccepted {
		desc := "attempt " + string(s.Outcome)
		if s.Err != nil {
			// For operators, as traces are: it may name internals.
			st.span.RecordError(s.Err)
			desc += ": " + s.Err.Error()
		}
		st.span.SetStatus(codes.Error, desc)
	}
	st.span.End()
	if st.run != nil && st.run.open == st {
		st.run.open = nil
	}
}

func (t *tracer) lookedUp(ctx context.Context, s engine.StepEvent, found bool) {
	attrs := trace.WithAttributes(attrStepName.String(s.Step), attrStepAttempt.Int(s.Attempt), attrLookupFound.Bool(found))
	if st := stepFrom(ctx); st != nil {
		st.span.AddEvent(LookupEventName, attrs)
	} else if r := runFrom(ctx); r != nil {
		// Engine.Cancel asks a lookup outside any attempt.
		r.span.AddEvent(LookupEventName, attrs)
	}
}

// waited adds the event of a wait step decided to the run's span: the
// engine tells it after the attempt's span ended when the wait was decided
// for the step to pass, before when it fails the step, so the run's is the
// span that is open either way.
func (t *tracer) waited(ctx context.Context, s engine.StepEvent, reason engine.WaitReason, waited time.Duration) {
	if r := runFrom(ctx); r != nil {
		r.span.AddEvent(WaitEventName, trace.WithAttributes(attrStepName.String(s.Step), attrStepAttempt.Int(s.Attempt),
			attrWaitReason.String(string(reason)), attrWaitDuration.Float64(waited.Seconds())))
	}
}
