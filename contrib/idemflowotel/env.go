package idemflowotel

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// FromEnv returns a TracerProvider configured by OpenTelemetry's standard
// environment variables, and the function that flushes and stops it at exit.
//
// When neither OTEL_EXPORTER_OTLP_ENDPOINT nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// is set, or OTEL_SDK_DISABLED is "true", it returns a no-op provider (a
// trace/noop one: spans cost next to nothing and go nowhere) and a shutdown
// that does nothing. Otherwise it returns an SDK provider that batches spans
// to an OTLP/HTTP exporter, which reads the OTEL_EXPORTER_OTLP_* variables
// (endpoint, headers, timeout, compression, TLS); the resource has
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, and the SDK reads the
// sampler (OTEL_TRACES_SAMPLER, by default parent-based, always on) and the
// batcher's settings (OTEL_BSP_*). Nothing global is set: pass the provider to
// Observer, RiverMiddleware, Transport and Handler.
func FromEnv(ctx context.Context) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	noShutdown := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") ||
		os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return tracenoop.NewTracerProvider(), noShutdown, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("idemflowotel: OTLP exporter: %w", err)
	}
	// The SDK's default resource reads OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES.
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	return sdk, sdk.Shutdown, nil
}
