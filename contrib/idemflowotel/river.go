package idemflowotel

import (
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// RiverMiddleware returns River's OpenTelemetry middleware (rivercontrib's
// otelriver) tracing with tp, for engine.RiverConfig.Middleware: a span for
// each insert of a job (river.insert_many, a child of the step attempt that
// hands its operation to a retry) and for each job worked
// (river.work/idemflow_resume, say), which a resumed run's span is a child of.
// The job carries the inserting span's W3C trace context in its metadata, and
// the work span links back to it: a retry's trace leads to the attempt that
// scheduled it (or to the sweeper's insert, when the sweeper resumed the
// operation first).
//
// It records no metrics (idemflowprom counts the engine's; for River's own,
// install otelriver with a MeterProvider of yours) and reads no global
// provider. A nil tp gives nil: no middleware.
func RiverMiddleware(tp trace.TracerProvider) []rivertype.Middleware {
	if tp == nil {
		return nil
	}
	return []rivertype.Middleware{otelriver.NewMiddleware(&otelriver.MiddlewareConfig{
		TracerProvider:              tp,
		MeterProvider:               metricnoop.NewMeterProvider(),
		EnableTracePropagation:      true,
		EnableWorkSpanJobKindSuffix: true,
	})}
}
