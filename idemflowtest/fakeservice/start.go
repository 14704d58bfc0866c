package fakeservice

import (
	"net/http/httptest"
	"testing"
)

// Start returns a Service with opts (nil: the defaults), served on a new
// httptest server at URL until the end of the test: t's cleanup closes both.
// A failed test logs every call the Service received.
func Start(t testing.TB, opts *Options) *Service {
	t.Helper()
	s := New(opts)
	s.server = httptest.NewServer(s)
	t.Cleanup(func() {
		if t.Failed() {
			s.log(t)
		}
		s.Close()
	})
	return s
}

// URL returns the base URL of a Service from Start, such as
// "http://127.0.0.1:40213", without a trailing slash; "" for one from New.
func (s *Service) URL() string {
	if s.server == nil {
		return ""
	}
	return s.server.URL
}

// log logs the Service's counts and every call under every key.
func (s *Service) log(t testing.TB) {
	t.Helper()
	t.Logf("fakeservice at %s: %d POSTs, %d effects, %d lookups", s.URL(), s.Requests(), s.Effects(), s.Lookups())
	for _, key := range s.Keys() {
		for _, c := range s.Calls(key) {
			t.Logf("fakeservice: key %q attempt %d: POST %s %s -> %d effect=%t replayed=%t fault=%v",
				key, c.Attempt, c.Path, c.Body, c.Status, c.Effect, c.Replayed, c.Fault)
		}
	}
}
