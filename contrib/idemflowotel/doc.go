// Package idemflowotel traces an idemflow engine with OpenTelemetry. It is a
// module of its own, so that a service that imports idemflow without it does
// not get OpenTelemetry in its module graph.
//
// Tracing is off unless configured: nothing here reads or sets a global
// provider or propagator. The caller passes a trace.TracerProvider, and a nil
// one turns each piece off.
//
//	tp, shutdown, err := idemflowotel.FromEnv(ctx)
//	defer shutdown(context.WithoutCancel(ctx))
//	e, err := engine.New(pool, &engine.Config{
//		Operations: ops,
//		Observer:   engine.Observers(metrics.Observer(), idemflowotel.Observer(tp, nil)),
//		River:      engine.RiverConfig{Middleware: idemflowotel.RiverMiddleware(tp)},
//	})
//	srv := &http.Server{Addr: addr, Handler: idemflowotel.Handler(tp, mux)}
//	bank := &http.Client{Transport: idemflowotel.Transport(tp, nil)}
//
// # Spans
//
// Observer gives each run of an operation a span, idemflow.run/NAME, a child
// of the span in the context the run begins with: a resume's is River's work
// span (see RiverMiddleware). A first attempt's run keeps the values of
// Start's context, not its cancellation, so it is the request's child even
// when it outlasts the request. Under a run,
// each attempt of a step has a span,
// idemflow.step/STEP, and the step's function gets the attempt's context, so
// that what it calls with that context (an HTTP request through Transport, a
// query of a traced driver) is a child of the attempt. A retry waited out in
// the run is another attempt's span in the same run; a retry handed to River
// is another run, in the trace of River's work span, which links back to the
// insert of its job: under the attempt that scheduled the retry, or the
// sweeper's, when the sweeper resumed the operation first.
//
// Attributes, after OpenTelemetry's naming conventions:
//
//   - idemflow.operation.name, idemflow.operation.version, idemflow.operation.id:
//     on every span
//   - idemflow.run.resumed: on a run, true for a resume (a retry, a recovery)
//   - idemflow.operation.status: on a run that finished its operation,
//     "succeeded" or "failed"
//   - idemflow.run.end_reason: on a run that ended without finishing its
//     operation and without failing (the engine's RunEnd:
//     handed_off, parked, key_taken, waiting, stopped)
//   - idemflow.step.name, idemflow.step.attempt (from 1): on an attempt
//   - idemflow.step.derived_key: on an attempt, the step's derived idempotency
//     key (Attempt.Key: what an external step's call sends, to find it in a
//     provider's logs; Opts.OmitDerivedKey leaves it out)
//   - idemflow.step.outcome: on an attempt, how it ended: "succeeded",
//     "retried", "pending" (the call was accepted and its outcome comes
//     later: the step waits for it), "failed" or "panicked"
//
// A lookup by derived key is an event of the attempt's span, idemflow.lookup,
// with idemflow.step.name, idemflow.step.attempt and idemflow.lookup.found.
//
// A step that waits for a signal, a moment or approvals hands its operation
// back: its attempt's span ends with the run's, idemflow.run.end_reason
// "handed_off". The run that decides the wait (a signal applied, the moment
// come, approved, rejected, expired) has an event, idemflow.wait, on its
// span, with idemflow.step.name, idemflow.step.attempt, idemflow.wait.reason
// ("signal", "timer" or "approval") and idemflow.wait.duration, how long the
// step waited from the moment it was reached, in seconds, by the database's
// clock. It is the run's event, not the attempt's: the attempt of a wait
// that passes has ended when the engine tells it.
//
// # Statuses
//
// Spans of what went well are left Unset, as OpenTelemetry asks of
// instrumentation. An attempt that did not succeed is Error, described by its
// outcome, except a pending one: the outside service accepted the call and
// answers later, which is no failure, so it is Unset (its outcome attribute
// says "pending"). A run is Error, with the error recorded, only when it failed
// itself: it lost its lease, the database failed it, the engine panicked. A run
// that finished its operation is Unset even when the operation failed (a
// business answer, or a compensated failure: idemflow.operation.status says
// so, and the failed attempt is Error); a run that handed its operation to a
// retry, parked it, found its key taken or stopped with the engine is Unset,
// with idemflow.run.end_reason.
//
// # Exporting
//
// FromEnv builds a provider from OpenTelemetry's environment variables: with
// OTEL_EXPORTER_OTLP_ENDPOINT set (http://collector:4318, say) an SDK provider
// whose batcher sends to an OTLP/HTTP exporter, else a no-op provider. A
// service calls it once at start, passes the provider to what it traces, and
// calls the shutdown at exit to flush the spans still batched.
package idemflowotel
