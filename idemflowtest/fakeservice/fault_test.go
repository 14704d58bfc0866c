package fakeservice_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
)

func TestFaults(t *testing.T) {
	t.Parallel()

	pay := request{key: "k1", body: `{"amount":100}`}
	lookup := request{method: http.MethodGet, path: "/by-key/k1"}
	failNext := func(n int, f fakeservice.Fault) func(*fakeservice.Service) {
		return func(s *fakeservice.Service) { s.FailNext(n, f) }
	}
	// keepAlive is a client that would reuse its connections, and that Go's
	// Transport would resend a request with an Idempotency-Key for, when a
	// reused connection closes before an answer.
	keepAlive := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}

	for _, tc := range []protocolCase{
		{
			name: "FaultError: 503 before the effect",
			steps: []step{
				{before: failNext(1, fakeservice.FaultError), req: pay, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 404, wantCode: "not_found"},
				{req: pay, wantStatus: 201},
			},
			wantEffects:  1,
			wantRequests: 2,
			wantLookups:  1,
		},
		{
			name: "FaultError on a replay",
			steps: []step{
				{req: pay, wantStatus: 201},
				{before: failNext(1, fakeservice.FaultError), req: pay, wantStatus: 503, wantCode: "unavailable"},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 3,
		},
		{
			name: "FaultLostResponse: the effect, then no answer; the lookup finds it",
			steps: []step{
				{before: failNext(1, fakeservice.FaultLostResponse), req: pay, wantErr: true},
				{req: lookup, wantStatus: 200},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 2},
			},
			wantEffects:  1,
			wantRequests: 2,
			wantLookups:  1,
		},
		{
			name:   "FaultLostResponse on a client that keeps connections alive",
			client: keepAlive,
			steps: []step{
				{req: request{key: "k0", body: `{}`}, wantStatus: 201},
				{before: failNext(1, fakeservice.FaultLostResponse), req: pay, wantErr: true},
				{req: pay, wantStatus: 201, wantReplayed: true},
			},
			wantEffects:  2,
			wantRequests: 3,
		},
		{
			name:   "FaultTimeout: the effect, then the client times out",
			client: &http.Client{Timeout: 100 * time.Millisecond},
			opts:   &fakeservice.Options{TimeoutDelay: time.Hour},
			steps: []step{
				{before: failNext(1, fakeservice.FaultTimeout), req: pay, wantErr: true},
				{req: lookup, wantStatus: 200},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 2},
			},
			wantEffects:  1,
			wantRequests: 2,
			wantLookups:  1,
		},
		{
			name: "FaultTimeout past TimeoutDelay: the connection is dropped",
			opts: &fakeservice.Options{TimeoutDelay: time.Millisecond},
			steps: []step{
				{before: failNext(1, fakeservice.FaultTimeout), req: pay, wantErr: true},
				{req: pay, wantStatus: 201, wantReplayed: true},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "FaultLookupError: 503 for lookups only",
			steps: []step{
				{before: failNext(2, fakeservice.FaultLookupError), req: pay, wantStatus: 201},
				{req: lookup, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 200, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  3,
		},
		{
			name: "FailNext queues in order",
			steps: []step{
				{before: func(s *fakeservice.Service) {
					s.FailNext(1, fakeservice.FaultError)
					s.FailNext(1, fakeservice.FaultNone)
					s.FailNext(2, fakeservice.FaultLostResponse)
					s.FailNext(0, fakeservice.FaultError)
					s.FailNext(-1, fakeservice.FaultError)
				}, req: pay, wantStatus: 503, wantCode: "unavailable"},
				{req: pay, wantStatus: 201},
				{req: pay, wantErr: true},
				{req: pay, wantErr: true},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 2},
			},
			wantEffects:  1,
			wantRequests: 5,
		},
		{
			name: "FaultFunc by attempt",
			opts: &fakeservice.Options{FaultFunc: func(req fakeservice.Request, attempt int) fakeservice.Fault {
				if req.Method != http.MethodPost {
					return fakeservice.FaultNone
				}
				return map[int]fakeservice.Fault{1: fakeservice.FaultError, 2: fakeservice.FaultLostResponse}[attempt]
			}},
			steps: []step{
				{req: pay, wantStatus: 503, wantCode: "unavailable"},
				{req: pay, wantErr: true},
				{req: pay, wantStatus: 201, wantReplayed: true},
				{req: request{key: "k2", body: `{}`}, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 200, sameAs: 3},
			},
			wantEffects:  1,
			wantRequests: 4,
			wantLookups:  1,
		},
		{
			name: "FaultFunc for lookups",
			opts: &fakeservice.Options{FaultFunc: func(req fakeservice.Request, attempt int) fakeservice.Fault {
				if req.Method == http.MethodGet {
					return map[int]fakeservice.Fault{1: fakeservice.FaultLostResponse, 2: fakeservice.FaultLookupError, 3: fakeservice.FaultError}[attempt]
				}
				return fakeservice.FaultNone
			}},
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: lookup, wantErr: true},
				{req: lookup, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 503, wantCode: "unavailable"},
				{req: lookup, wantStatus: 200, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  4,
		},
		{
			name: "a queued fault goes before FaultFunc, which it does not ask",
			opts: &fakeservice.Options{FaultFunc: func(fakeservice.Request, int) fakeservice.Fault {
				return fakeservice.FaultLostResponse
			}},
			steps: []step{
				{before: failNext(1, fakeservice.FaultNone), req: pay, wantStatus: 201},
				{req: pay, wantErr: true},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "FaultLookupError from FaultFunc on a POST is a 503",
			opts: &fakeservice.Options{FaultFunc: func(fakeservice.Request, int) fakeservice.Fault {
				return fakeservice.FaultLookupError
			}},
			steps:        []step{{req: pay, wantStatus: 503, wantCode: "unavailable"}},
			wantRequests: 1,
		},
		{
			name: "a fault that is none of the constants is a 500",
			opts: &fakeservice.Options{FaultFunc: func(fakeservice.Request, int) fakeservice.Fault { return 99 }},
			steps: []step{
				{req: pay, wantStatus: 500, wantCode: "invalid_fault"},
				{req: lookup, wantStatus: 500, wantCode: "invalid_fault"},
			},
			wantRequests: 1,
			wantLookups:  1,
		},
		{
			name: "requests refused before the key's turn take no fault",
			steps: []step{
				{before: failNext(1, fakeservice.FaultError), req: request{body: `{}`}, wantStatus: 400, wantCode: "missing_idempotency_key"},
				{req: request{key: "k1", body: `{`}, wantStatus: 400, wantCode: "invalid_body"},
				{req: pay, wantStatus: 503, wantCode: "unavailable"},
			},
			wantRequests: 3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

func TestFaultRetryAfter(t *testing.T) {
	t.Parallel()
	svc := fakeservice.Start(t, nil)
	svc.FailNext(1, fakeservice.FaultError)
	svc.FailNext(1, fakeservice.FaultLookupError)
	post := mustSend(t, svc.URL(), request{key: "k1", body: `{}`})
	get := mustSend(t, svc.URL(), request{method: http.MethodGet, path: "/by-key/k1"})
	for _, a := range []answer{post, get} {
		require.Equal(t, http.StatusServiceUnavailable, a.status)
		require.Equal(t, "0", a.header.Get("Retry-After"))
	}
	calls := svc.Calls("k1")
	require.Len(t, calls, 1)
	require.Equal(t, fakeservice.FaultError, calls[0].Fault)
}

func TestFaultLostResponseCall(t *testing.T) {
	t.Parallel()
	svc := fakeservice.Start(t, nil)
	svc.FailNext(1, fakeservice.FaultLostResponse)
	_, err := send(t, nil, svc.URL(), request{key: "k1", body: `{}`})
	require.Error(t, err)
	require.Equal(t, []fakeservice.Call{{
		Request: svc.Calls("k1")[0].Request,
		Attempt: 1, Status: 201, Effect: true, Fault: fakeservice.FaultLostResponse,
	}}, svc.Calls("k1"), "the status the client did not hear")
}

func TestFaultTimeoutEndsWithTheClient(t *testing.T) {
	t.Parallel()
	svc := fakeservice.New(&fakeservice.Options{TimeoutDelay: time.Hour})
	returned := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(returned)
		svc.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	svc.FailNext(1, fakeservice.FaultTimeout)
	_, err := send(t, &http.Client{Timeout: 20 * time.Millisecond}, srv.URL, request{key: "k1", body: `{}`})
	var netErr net.Error
	require.ErrorAs(t, err, &netErr)
	require.True(t, netErr.Timeout(), "%v", err)

	select {
	case <-returned: // the handler stopped holding when the client gave up
	case <-t.Context().Done():
		t.Fatal("the handler still holds the answer")
	}
	require.Equal(t, 1, svc.Effects())
}

func TestCloseEndsFaultTimeout(t *testing.T) {
	t.Parallel()
	answered := make(chan struct{})
	svc := fakeservice.Start(t, &fakeservice.Options{
		TimeoutDelay: time.Hour,
		AnswerFunc: func(fakeservice.Request) (int, any) {
			close(answered)
			return 0, map[string]string{}
		},
	})
	svc.FailNext(1, fakeservice.FaultTimeout)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, svc.URL()+"/payments", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k1")
	errc := make(chan error, 1)
	go func() {
		// No client timeout: only Close ends the hold.
		resp, err := (&http.Client{}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-answered
	svc.Close()
	err = <-errc
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.Equal(t, 1, svc.Effects())
}

// Over HTTP/2 a connection cannot be hijacked: the response is aborted (the
// stream reset) instead.
func TestFaultLostResponseHTTP2(t *testing.T) {
	t.Parallel()
	svc := fakeservice.New(nil)
	srv := httptest.NewUnstartedServer(svc)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := srv.Client()

	a := mustSendWith(t, client, srv.URL, request{key: "k0", body: `{}`})
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, "HTTP/2.0", a.proto)

	svc.FailNext(1, fakeservice.FaultLostResponse)
	_, err := send(t, client, srv.URL, request{key: "k1", body: `{}`})
	require.Error(t, err)
	require.Equal(t, 2, svc.Effects())
}

func mustSendWith(t *testing.T, client *http.Client, base string, r request) answer {
	t.Helper()
	a, err := send(t, client, base, r)
	require.NoError(t, err)
	return a
}

func TestFailNextInvalid(t *testing.T) {
	t.Parallel()
	svc := fakeservice.New(nil)
	require.Panics(t, func() { svc.FailNext(1, fakeservice.Fault(-1)) })
	require.Panics(t, func() { svc.FailNext(1, fakeservice.Fault(99)) })
}

func TestFaultString(t *testing.T) {
	t.Parallel()
	for f, want := range map[fakeservice.Fault]string{
		fakeservice.FaultNone:         "none",
		fakeservice.FaultError:        "error",
		fakeservice.FaultLostResponse: "lost_response",
		fakeservice.FaultTimeout:      "timeout",
		fakeservice.FaultLookupError:  "lookup_error",
		fakeservice.Fault(7):          "Fault(7)",
	} {
		require.Equal(t, want, f.String())
	}
}
