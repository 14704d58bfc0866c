package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/idemflow/idemflow/cmd/internal/demoapi"
	"github.com/idemflow/idemflow/idempotency"
)

// The API client that the http mode calls as, and its bearer token.
const (
	apiToken = "bench-token"
	apiWait  = 5 * time.Second
)

// serveAPI serves the demo's API (demoapi, as cmd/demo builds it: the bearer
// token check, idempotency.Handler with the refund operation and the demo's
// decoding, the demo's HTTP server and its limits) on a loopback port, and
// returns the URL of POST /refunds; e closes the server.
func (b *bench) serveAPI(e *env) (string, error) {
	api, err := demoapi.New(&demoapi.Config{
		Pool: e.app, Engine: e.eng, Workflows: e.wf,
		Clients: []demoapi.Client{{Name: benchClient, Token: apiToken}},
		Wait:    apiWait, Logger: b.quiet,
	})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen on loopback: %w", err)
	}
	limit := demoapi.DefaultMaxConns()
	srv := demoapi.NewHTTPServer(api, apiWait, idempotency.DefaultReserveTimeout, demoapi.NewConnLimiter(limit, limit))
	go func() { _ = srv.Serve(ln) }()
	e.closers = append(e.closers, func(ctx context.Context) { _ = srv.Shutdown(ctx) })
	return "http://" + ln.Addr().String() + "/refunds", nil
}

// errStatus is an answer of the API other than the refund.
var errStatus = errors.New("unexpected answer")
