package main

import (
	"context"
	"os"

	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/contrib/idemflowotel"
)

// tracing returns the tracer provider the demo exports its traces with, over
// OTLP/HTTP, when OpenTelemetry's standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; else nil, which leaves tracing
// off and costs the hot path nothing. shutdown flushes it at exit.
func tracing(ctx context.Context) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, func(context.Context) error { return nil }, nil
	}
	return idemflowotel.FromEnv(ctx)
}
