package main

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

// The API client that the http mode calls as, and its bearer token.
const (
	apiToken = "bench-token"
	apiWait  = 5 * time.Second
)

// serveAPI serves POST /refunds on a loopback port the way cmd/demo does
// (cmd/demo is a main package, so its server is rebuilt here from the same
// parts): a bearer-token check, then idempotency.Handler with the refund
// operation, the demo's decoding of the body, a 5-second wait. It returns the
// endpoint's URL; e closes the server.
func (b *bench) serveAPI(e *env) (string, error) {
	refunds, err := idempotency.Handler(&idempotency.Config{
		Engine:    e.eng,
		ScopeFunc: func(*http.Request) (string, error) { return benchClient, nil },
		Wait:      apiWait,
		Logger:    b.quiet,
	}, e.wf.Refund, &idempotency.EndpointOpts[refund.RefundInput]{
		DecodeFunc:      decodeRefund,
		Unfingerprinted: []string{"metadata"},
	})
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /refunds", authenticated(refunds))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen on loopback: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	e.closers = append(e.closers, func(ctx context.Context) { _ = srv.Shutdown(ctx) })
	return "http://" + ln.Addr().String() + "/refunds", nil
}

// authenticated answers 401 unless the request carries the client's token, as
// the demo's middleware does.
func authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(token)), []byte(apiToken)) != 1 {
			idempotency.WriteError(w, http.StatusUnauthorized, "unauthenticated", "missing or unknown bearer token", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// decodeRefund reads POST /refunds's body as the demo does.
func decodeRefund(_ *http.Request, f idempotency.Fields) (refund.RefundInput, error) {
	in := refund.RefundInput{Client: benchClient}
	if err := f.Only("orderId", "amount", "metadata"); err != nil {
		return in, err
	}
	if err := f.Required("orderId", &in.OrderID); err != nil {
		return in, err
	}
	if in.OrderID == "" || len(in.OrderID) > 255 {
		return in, &idempotency.FieldError{Param: "orderId", Message: "must be a string of 1 to 255 bytes"}
	}
	if err := f.Required("amount", &in.Amount); err != nil {
		return in, err
	}
	if in.Amount <= 0 {
		return in, &idempotency.FieldError{Param: "amount", Message: "must be a positive integer (minor units)"}
	}
	if raw, ok := f["metadata"]; ok && string(raw) != "null" {
		in.Metadata = raw
	}
	return in, nil
}

// errStatus is an answer of the API other than the refund.
var errStatus = errors.New("unexpected answer")
