package idemflowotel_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/contrib/idemflowotel"
)

// TestHandlerAndTransport: a request sent through Transport carries its
// client span in a traceparent header, without a global propagator, and
// Handler's server span continues it.
func TestHandlerAndTransport(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	var inHandler trace.SpanContext
	srv := httptest.NewServer(idemflowotel.Handler(rec.tp, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		inHandler = trace.SpanContextFromContext(r.Context())
	})))

	ctx, parent := rec.tp.Tracer("test").Start(t.Context(), "caller")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	res, err := (&http.Client{Transport: idemflowotel.Transport(rec.tp, nil)}).Do(req)
	require.NoError(t, err)
	require.NoError(t, res.Body.Close())
	parent.End()
	srv.Close() // waits for the handler, whose span ends after it

	spans := rec.exp.GetSpans()
	client := named(spans, "HTTP GET")
	require.Len(t, client, 1, "%v", names(spans))
	require.Equal(t, trace.SpanKindClient, client[0].SpanKind)
	require.True(t, client[0].Parent.Equal(parent.SpanContext()))
	server := named(spans, "GET")
	require.Len(t, server, 1, "%v", names(spans))
	require.Equal(t, trace.SpanKindServer, server[0].SpanKind)
	require.Equal(t, client[0].SpanContext.SpanID(), server[0].Parent.SpanID(), "the server span continues the client's")
	require.True(t, server[0].Parent.IsRemote())
	require.True(t, inHandler.Equal(server[0].SpanContext))
}
