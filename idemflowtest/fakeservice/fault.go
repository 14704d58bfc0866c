package fakeservice

import (
	"fmt"
	"strconv"
)

// Fault is a failure that the Service injects into a request (see the package
// documentation, "Faults").
type Fault int

const (
	// FaultNone lets the request through.
	FaultNone Fault = iota
	// FaultError answers a POST (or a lookup) 503 with Retry-After: 0 before
	// anything happens: nothing takes effect.
	FaultError
	// FaultLostResponse handles the request as usual (a first request takes
	// effect), then closes the connection without an answer.
	FaultLostResponse
	// FaultTimeout handles the request as usual (a first request takes effect),
	// then holds the answer back until the client gives up,
	// Options.TimeoutDelay has passed or the Service is closed, and closes the
	// connection without an answer.
	FaultTimeout
	// FaultLookupError answers a lookup 503 with Retry-After: 0. FailNext gives
	// it to lookups; a POST that gets it from Options.FaultFunc is answered as
	// for FaultError.
	FaultLookupError
)

// String returns the fault's name: "none", "error", "lost_response", "timeout"
// or "lookup_error".
func (f Fault) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultError:
		return "error"
	case FaultLostResponse:
		return "lost_response"
	case FaultTimeout:
		return "timeout"
	case FaultLookupError:
		return "lookup_error"
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// valid reports whether f is one of the faults above.
func (f Fault) valid() bool { return f >= FaultNone && f <= FaultLookupError }

// FailNext makes the next n requests of f's kind fail with f, after those
// queued before: FaultLookupError goes to lookups, any other fault to keyed
// POSTs with a JSON body (FaultNone lets them through, ahead of faults queued
// after it). A request that takes a queued fault does not ask
// Options.FaultFunc. n <= 0 queues nothing. FailNext panics on a Fault that is
// none of the constants.
func (s *Service) FailNext(n int, f Fault) {
	if !f.valid() {
		panic(fmt.Sprintf("fakeservice: FailNext with %v", f))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for range max(n, 0) {
		if f == FaultLookupError {
			s.lookupFaults++
		} else {
			s.postFaults = append(s.postFaults, f)
		}
	}
}
