package idemflowotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemflow/idemflow/contrib/idemflowotel"
)

// TestFromEnv: a no-op provider without an endpoint; with one, an SDK
// provider whose spans reach it over OTLP/HTTP by shutdown. (t.Setenv: not
// parallel.)
func TestFromEnv(t *testing.T) {
	t.Run("Unset", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		tp, shutdown, err := idemflowotel.FromEnv(t.Context())
		require.NoError(t, err)
		require.IsType(t, tracenoop.TracerProvider{}, tp)
		_, span := tp.Tracer("test").Start(t.Context(), "nothing")
		require.False(t, span.IsRecording())
		require.False(t, span.SpanContext().IsValid())
		span.End()
		require.NoError(t, shutdown(t.Context()))
	})

	t.Run("Disabled", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		t.Setenv("OTEL_SDK_DISABLED", "true")
		tp, _, err := idemflowotel.FromEnv(t.Context())
		require.NoError(t, err)
		require.IsType(t, tracenoop.TracerProvider{}, tp)
	})

	t.Run("Endpoint", func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
			mu.Unlock()
			require.NotEmpty(t, body)
			w.WriteHeader(http.StatusOK)
		}))
		defer collector.Close()
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
		t.Setenv("OTEL_SDK_DISABLED", "")
		tp, shutdown, err := idemflowotel.FromEnv(t.Context())
		require.NoError(t, err)
		_, span := tp.Tracer("test").Start(t.Context(), "exported")
		require.True(t, span.IsRecording())
		span.End()
		require.NoError(t, shutdown(context.WithoutCancel(t.Context())), "shutdown flushes the batch")
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"POST /v1/traces application/x-protobuf"}, got)
	})
}
