package main

import (
	"net/http"
	"net/http/httptest"
	"time"
)

// handlerTransport is an http.RoundTripper that serves each request with h in
// the calling goroutine, with no socket: the provider is called this way in every
// mode, so that its cost is the handler's and the database's, not loopback's.
type handlerTransport struct {
	h http.Handler
	// delay, when positive, is waited before each request is served, as a
	// provider across a network answers later (the fairness mode's
	// -provider-latency).
	delay time.Duration
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.delay > 0 {
		timer := time.NewTimer(t.delay)
		select {
		case <-req.Context().Done():
			timer.Stop()
			return nil, req.Context().Err()
		case <-timer.C:
		}
	}
	// A RoundTripper must not change the request it is given.
	r := req.Clone(req.Context())
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI = r.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}
