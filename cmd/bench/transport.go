package main

import (
	"net/http"
	"net/http/httptest"
)

// handlerTransport is an http.RoundTripper that serves each request with h in
// the calling goroutine, with no socket: the provider is called this way in every
// mode, so that its cost is the handler's and the database's, not loopback's.
type handlerTransport struct {
	h http.Handler
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
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
