package idemflowotel

import (
	"net/http"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is the W3C trace context, which Transport sends and Handler
// reads: set here rather than taken from the global propagator, which is a
// no-op until a program sets one.
var propagator = propagation.TraceContext{}

// Transport wraps rt (nil: http.DefaultTransport) with otelhttp's: each
// request gets a client span, a child of the span in its context, and a W3C
// traceparent header. A step's context is its attempt's, so an external step
// whose http.Client has this transport sends its call under the attempt's
// span, and the provider can join the trace. It records no metrics and reads
// no global provider. A nil tp gives rt itself.
func Transport(tp trace.TracerProvider, rt http.RoundTripper) http.RoundTripper {
	if tp == nil {
		if rt == nil {
			return http.DefaultTransport
		}
		return rt
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()))
}

// Handler wraps h (a service's mux, say) with otelhttp's handler: each
// request gets a server span, named after its method and route as
// OpenTelemetry's HTTP conventions ask, a child of the caller's span when the
// request carries a W3C traceparent header. It records no metrics and reads no
// global provider. A nil tp gives h itself.
func Handler(tp trace.TracerProvider, h http.Handler) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagator),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()))
}
