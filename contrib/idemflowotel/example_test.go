package idemflowotel_test

import (
	"context"
	"log"
	"net/http"

	"github.com/idemflow/idemflow/contrib/idemflowotel"
	"github.com/idemflow/idemflow/engine"
)

// A service traces its engine, its River jobs, its handlers and its calls to
// providers with one provider, exported over OTLP/HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT is set and a no-op otherwise.
func ExampleFromEnv() {
	ctx := context.Background()
	tp, shutdown, err := idemflowotel.FromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = shutdown(context.WithoutCancel(ctx)) }()

	cfg := &engine.Config{
		// engine.Observers(metrics.Observer(), ...) with idemflowprom too.
		Observer: engine.Observers(idemflowotel.Observer(tp, nil)),
		River:    engine.RiverConfig{Middleware: idemflowotel.RiverMiddleware(tp)},
	}
	bank := &http.Client{Transport: idemflowotel.Transport(tp, nil)}
	srv := &http.Server{Addr: ":8080", Handler: idemflowotel.Handler(tp, http.NewServeMux())}
	_, _, _ = cfg, bank, srv
}
