package fakeservice_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
)

// answer is an HTTP answer, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
	// close: the answer said Connection: close (Go's client takes the header
	// out of the Header).
	close bool
	proto string
}

// code returns the code of an error answer, checking its shape.
func (a answer) code(t *testing.T) string {
	t.Helper()
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	require.NoError(t, json.Unmarshal(a.body, &body), "body: %s", a.body)
	require.NotEmpty(t, body.Message, "body: %s", a.body)
	return body.Code
}

// made is the default answer of a request that took effect.
type made struct {
	ID      string          `json:"id"`
	Key     string          `json:"key"`
	Request json.RawMessage `json:"request"`
}

// request is one request a test sends.
type request struct {
	method string // defaults to POST
	path   string // defaults to /payments
	key    string // the Idempotency-Key header; none when empty
	header http.Header
	body   string
}

// send sends r to the service at base with client (nil: a client with a short
// timeout) and returns its answer, or the client's error.
func send(t *testing.T, client *http.Client, base string, r request) (answer, error) {
	t.Helper()
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/payments"
	}
	req, err := http.NewRequestWithContext(t.Context(), r.method, base+r.path, strings.NewReader(r.body))
	require.NoError(t, err)
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.key != "" {
		req.Header.Set("Idempotency-Key", r.key)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body, close: resp.Close, proto: resp.Proto}, nil
}

// mustSend is send that fails the test on a client error.
func mustSend(t *testing.T, base string, r request) answer {
	t.Helper()
	a, err := send(t, nil, base, r)
	require.NoError(t, err)
	return a
}

// step is one request of a table case and what it must get.
type step struct {
	// before, when set, runs first (to queue faults).
	before func(s *fakeservice.Service)
	req    request
	// wantErr: the client gets no answer, only an error.
	wantErr bool
	// wantStatus is the answer's status.
	wantStatus int
	// wantCode is the code of an error answer; "" for an answer that is not one.
	wantCode string
	// wantReplayed: the answer carries Idempotent-Replayed: true.
	wantReplayed bool
	// sameAs, when not 0, is the number (from 1) of an earlier step whose body
	// this step's must equal byte for byte.
	sameAs int
}

// protocolCase is a table case: a service, the requests sent to it in order, and
// its counts at the end.
type protocolCase struct {
	name         string
	opts         *fakeservice.Options
	client       *http.Client
	steps        []step
	wantEffects  int
	wantRequests int
	wantLookups  int
}

func (tc protocolCase) run(t *testing.T) {
	t.Helper()
	svc := fakeservice.Start(t, tc.opts)
	bodies := make([][]byte, len(tc.steps))
	for i, st := range tc.steps {
		if st.before != nil {
			st.before(svc)
		}
		a, err := send(t, tc.client, svc.URL(), st.req)
		if st.wantErr {
			require.Error(t, err, "step %d: got %d %s", i+1, a.status, a.body)
			continue
		}
		require.NoError(t, err, "step %d", i+1)
		bodies[i] = a.body
		require.Equal(t, st.wantStatus, a.status, "step %d: %s", i+1, a.body)
		require.Equal(t, "application/json", a.header.Get("Content-Type"), "step %d", i+1)
		require.True(t, a.close, "step %d: Connection: close", i+1)
		if st.wantCode != "" {
			require.Equal(t, st.wantCode, a.code(t), "step %d", i+1)
		}
		if st.wantReplayed {
			require.Equal(t, "true", a.header.Get("Idempotent-Replayed"), "step %d", i+1)
		} else {
			require.Empty(t, a.header.Get("Idempotent-Replayed"), "step %d", i+1)
		}
		if st.sameAs != 0 {
			require.Equal(t, string(bodies[st.sameAs-1]), string(a.body), "step %d", i+1)
		}
	}
	require.Equal(t, tc.wantEffects, svc.Effects(), "effects")
	require.Equal(t, tc.wantRequests, svc.Requests(), "requests")
	require.Equal(t, tc.wantLookups, svc.Lookups(), "lookups")
}

func TestProtocol(t *testing.T) {
	t.Parallel()

	pay := request{key: "k1", body: `{"amount":100,"currency":"EUR"}`}
	lookup := func(key string) request { return request{method: http.MethodGet, path: "/by-key/" + key} }
	declineBig := func(req fakeservice.Request) (int, any) {
		var in struct{ Amount int }
		if err := json.Unmarshal(req.Body, &in); err != nil || in.Amount > 1000 {
			return http.StatusUnprocessableEntity, map[string]string{"code": "declined", "message": "amount too large"}
		}
		return 0, map[string]string{"paymentId": "pay_" + req.Key}
	}

	for _, tc := range []protocolCase{
		{
			name:         "the first request under a key is made",
			steps:        []step{{req: pay, wantStatus: 201}},
			wantEffects:  1,
			wantRequests: 1,
		},
		{
			name: "the same body replays the stored answer",
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 1},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 3,
		},
		{
			name: "a body equal as JSON replays",
			steps: []step{
				{req: request{key: "k1", body: `{"a":1,"b":[1,{"c":"x","d":null}]}`}, wantStatus: 201},
				{req: request{key: "k1", body: " {\n \"b\": [1, {\"d\": null, \"c\": \"x\"}], \"a\": 1 }\n"}, wantStatus: 201, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "another body under the key is refused",
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: request{key: "k1", body: `{"amount":101,"currency":"EUR"}`}, wantStatus: 422, wantCode: "idempotency_key_reused"},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 3,
		},
		{
			name: "a number written otherwise is another body",
			steps: []step{
				{req: request{key: "k1", body: `{"amount":100}`}, wantStatus: 201},
				{req: request{key: "k1", body: `{"amount":1e2}`}, wantStatus: 422, wantCode: "idempotency_key_reused"},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "a key made on one path replays on another",
			steps: []step{
				{req: request{path: "/a", key: "k1", body: `{}`}, wantStatus: 201},
				{req: request{path: "/b/c", key: "k1", body: `{}`}, wantStatus: 201, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "different keys are different requests",
			steps: []step{
				{req: request{key: "k1", body: `{}`}, wantStatus: 201},
				{req: request{key: "k2", body: `{}`}, wantStatus: 201},
			},
			wantEffects:  2,
			wantRequests: 2,
		},
		{
			name:         "a POST without a key is refused",
			steps:        []step{{req: request{body: `{"amount":100}`}, wantStatus: 400, wantCode: "missing_idempotency_key"}},
			wantRequests: 1,
		},
		{
			name: "a body that is not JSON is refused, and leaves the key free",
			steps: []step{
				{req: request{key: "k1", body: `{"amount":`}, wantStatus: 400, wantCode: "invalid_body"},
				{req: request{key: "k1", body: ``}, wantStatus: 400, wantCode: "invalid_body"},
				{req: request{key: "k1", body: `{} {}`}, wantStatus: 400, wantCode: "invalid_body"},
				{req: pay, wantStatus: 201},
			},
			wantEffects:  1,
			wantRequests: 4,
		},
		{
			name: "the key header can be renamed",
			opts: &fakeservice.Options{KeyHeader: "X-Request-Key"},
			steps: []step{
				{req: pay, wantStatus: 400, wantCode: "missing_idempotency_key"},
				{req: request{header: http.Header{"X-Request-Key": {"k1"}}, body: `{}`}, wantStatus: 201},
				{req: request{header: http.Header{"X-Request-Key": {"k1"}}, body: `{}`}, wantStatus: 201, wantReplayed: true, sameAs: 2},
			},
			wantEffects:  1,
			wantRequests: 3,
		},
		{
			name: "the status can be set",
			opts: &fakeservice.Options{Status: http.StatusOK},
			steps: []step{
				{req: pay, wantStatus: 200},
				{req: pay, wantStatus: 200, wantReplayed: true, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 2,
		},
		{
			name: "AnswerFunc builds the answer, which is stored and replayed",
			opts: &fakeservice.Options{AnswerFunc: declineBig},
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: pay, wantStatus: 201, wantReplayed: true, sameAs: 1},
				{req: lookup("k1"), wantStatus: 200, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 2,
			wantLookups:  1,
		},
		{
			name: "AnswerFunc declines: no effect, nothing stored",
			opts: &fakeservice.Options{AnswerFunc: declineBig},
			steps: []step{
				{req: request{key: "k1", body: `{"amount":5000}`}, wantStatus: 422, wantCode: "declined"},
				{req: lookup("k1"), wantStatus: 404, wantCode: "not_found"},
				{req: request{key: "k1", body: `{"amount":5000}`}, wantStatus: 422, wantCode: "declined"},
				// The key stays free: another body is a first request.
				{req: request{key: "k1", body: `{"amount":50}`}, wantStatus: 201},
			},
			wantEffects:  1,
			wantRequests: 3,
			wantLookups:  1,
		},
		{
			name: "AnswerFunc's status and body as JSON bytes",
			opts: &fakeservice.Options{AnswerFunc: func(fakeservice.Request) (int, any) {
				return http.StatusAccepted, json.RawMessage(`{"state":"pending"}`)
			}},
			steps: []step{
				{req: pay, wantStatus: 202},
				{req: lookup("k1"), wantStatus: 200, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  1,
		},
		{
			name: "AnswerFunc's body that is not JSON is a 500, no effect",
			opts: &fakeservice.Options{AnswerFunc: func(fakeservice.Request) (int, any) { return 0, []byte(`{`) }},
			steps: []step{
				{req: pay, wantStatus: 500, wantCode: "invalid_answer"},
			},
			wantRequests: 1,
		},
		{
			name: "a lookup answers the stored answer",
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: lookup("k1"), wantStatus: 200, sameAs: 1},
				{req: lookup("k2"), wantStatus: 404, wantCode: "not_found"},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  2,
		},
		{
			name: "a lookup of a key never made is 404, and makes nothing",
			steps: []step{
				{req: lookup("k1"), wantStatus: 404, wantCode: "not_found"},
				{req: pay, wantStatus: 201},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  1,
		},
		{
			name: "a lookup of a path-escaped key",
			steps: []step{
				{req: request{key: "op 1/pay?x=%", body: `{}`}, wantStatus: 201},
				{req: lookup("op%201%2Fpay%3Fx=%25"), wantStatus: 200, sameAs: 1},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  1,
		},
		{
			name: "the lookup prefix can be set",
			opts: &fakeservice.Options{LookupPrefix: "/payments/by-key/"},
			steps: []step{
				{req: pay, wantStatus: 201},
				{req: request{method: http.MethodGet, path: "/payments/by-key/k1"}, wantStatus: 200, sameAs: 1},
				{req: lookup("k1"), wantStatus: 404, wantCode: "no_route"},
			},
			wantEffects:  1,
			wantRequests: 1,
			wantLookups:  1,
		},
		{
			name: "other routes",
			steps: []step{
				{req: request{method: http.MethodGet, path: "/payments"}, wantStatus: 404, wantCode: "no_route"},
				{req: request{method: http.MethodGet, path: "/by-key/"}, wantStatus: 404, wantCode: "no_route"},
				{req: request{method: http.MethodGet, path: "/by-keyk1"}, wantStatus: 404, wantCode: "no_route"},
				{req: request{method: http.MethodPut, key: "k1", body: `{}`}, wantStatus: 405, wantCode: "method_not_allowed"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

func TestDefaultAnswer(t *testing.T) {
	t.Parallel()
	svc := fakeservice.Start(t, nil)

	first := mustSend(t, svc.URL(), request{key: "k1", body: `{ "amount": 100 }`})
	require.Equal(t, http.StatusCreated, first.status)
	require.True(t, first.close, "Connection: close")
	var m made
	require.NoError(t, json.Unmarshal(first.body, &m))
	require.Equal(t, made{ID: "fs_1", Key: "k1", Request: json.RawMessage(`{"amount":100}`)}, m)

	second := mustSend(t, svc.URL(), request{key: "k2", body: `{"amount":100}`})
	require.NoError(t, json.Unmarshal(second.body, &m))
	require.Equal(t, "fs_2", m.ID)
	require.Equal(t, "k2", m.Key)
}

func TestCalls(t *testing.T) {
	t.Parallel()
	svc := fakeservice.Start(t, nil)
	require.Nil(t, svc.Calls("k1"))
	require.Empty(t, svc.Keys())

	mustSend(t, svc.URL(), request{path: "/b", key: "k2", body: `{"n":2}`, header: http.Header{"X-Trace": {"t1"}}})
	mustSend(t, svc.URL(), request{path: "/a", key: "k1", body: `{"n":1}`})
	mustSend(t, svc.URL(), request{path: "/a", key: "k1", body: `{"n":1}`})
	svc.FailNext(1, fakeservice.FaultError)
	mustSend(t, svc.URL(), request{path: "/a", key: "k1", body: `{"n":1}`})
	mustSend(t, svc.URL(), request{path: "/a", key: "k1", body: `{"n":9}`})
	mustSend(t, svc.URL(), request{path: "/a", key: "k3", body: `nope`})
	mustSend(t, svc.URL(), request{path: "/a", body: `{}`}) // no key: in no Calls
	mustSend(t, svc.URL(), request{method: http.MethodGet, path: "/by-key/k4"})

	require.Equal(t, []string{"k1", "k2", "k3"}, svc.Keys(), "a lookup is no call")
	calls := svc.Calls("k1")
	require.Len(t, calls, 4)
	for i, want := range []fakeservice.Call{
		{Attempt: 1, Status: 201, Effect: true},
		{Attempt: 2, Status: 201, Replayed: true},
		{Attempt: 3, Status: 503, Fault: fakeservice.FaultError},
		{Attempt: 4, Status: 422},
	} {
		got := calls[i]
		require.Equal(t, http.MethodPost, got.Method, "call %d", i+1)
		require.Equal(t, "/a", got.Path, "call %d", i+1)
		require.Equal(t, "k1", got.Key, "call %d", i+1)
		got.Request = fakeservice.Request{}
		require.Equal(t, want, got, "call %d", i+1)
	}
	require.JSONEq(t, `{"n":1}`, string(calls[0].Body))
	require.JSONEq(t, `{"n":9}`, string(calls[3].Body))

	k2 := svc.Calls("k2")
	require.Len(t, k2, 1)
	require.Equal(t, "t1", k2[0].Header.Get("X-Trace"))
	k2[0].Header.Set("X-Trace", "changed")
	k2[0].Body[0] = 'X'
	require.Equal(t, "t1", svc.Calls("k2")[0].Header.Get("X-Trace"), "Calls returns copies")
	require.JSONEq(t, `{"n":2}`, string(svc.Calls("k2")[0].Body), "Calls returns copies")

	k3 := svc.Calls("k3")
	require.Len(t, k3, 1)
	require.Equal(t, 400, k3[0].Status)
	require.False(t, k3[0].Effect)

	require.Equal(t, 1, svc.EffectsFor("k1"))
	require.Equal(t, 1, svc.EffectsFor("k2"))
	require.Equal(t, 0, svc.EffectsFor("k3"))
	require.Equal(t, 0, svc.EffectsFor("k4"))
	require.Equal(t, 2, svc.Effects())
	require.Equal(t, 7, svc.Requests())
	require.Equal(t, 1, svc.Lookups())
}

func TestDuplicates(t *testing.T) {
	t.Parallel()

	type post struct {
		key, body string
		fault     fakeservice.Fault
	}
	for _, tc := range []struct {
		name  string
		opts  *fakeservice.Options
		posts []post
		want  []fakeservice.Duplicate
	}{
		{
			name:  "one key per request: none",
			posts: []post{{key: "k1", body: `{"n":1}`}, {key: "k2", body: `{"n":2}`}},
		},
		{
			name: "retries under one key: none",
			posts: []post{
				{key: "k1", body: `{"n":1}`, fault: fakeservice.FaultLostResponse},
				{key: "k1", body: `{"n":1}`},
				{key: "k1", body: `{"n":1}`},
			},
		},
		{
			name: "a fresh key on each attempt",
			posts: []post{
				{key: "r1", body: `{"n":1}`, fault: fakeservice.FaultLostResponse},
				{key: "r2", body: `{"n":1}`, fault: fakeservice.FaultError},
				{key: "r3", body: `{ "n": 1 }`},
				{key: "k9", body: `{"n":2}`},
				{key: "r4", body: `{"n":1}`},
			},
			want: []fakeservice.Duplicate{{Body: json.RawMessage(`{"n":1}`), Keys: []string{"r1", "r3", "r4"}, Requests: 4}},
		},
		{
			name: "two groups, in the order of their first effects",
			posts: []post{
				{key: "a1", body: `{"a":1,"b":2}`},
				{key: "b1", body: `{"n":2}`},
				{key: "b2", body: `{"n":2}`},
				{key: "a2", body: `{"b":2,"a":1}`},
			},
			want: []fakeservice.Duplicate{
				{Body: json.RawMessage(`{"a":1,"b":2}`), Keys: []string{"a1", "a2"}, Requests: 2},
				{Body: json.RawMessage(`{"n":2}`), Keys: []string{"b1", "b2"}, Requests: 2},
			},
		},
		{
			name: "refusals take no effect: none",
			opts: &fakeservice.Options{AnswerFunc: func(req fakeservice.Request) (int, any) {
				if req.Key != "k1" {
					return 422, map[string]string{"code": "declined", "message": "no"}
				}
				return 0, map[string]string{}
			}},
			posts: []post{{key: "k1", body: `{"n":1}`}, {key: "k2", body: `{"n":1}`}, {key: "k3", body: `{"n":1}`}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			svc := fakeservice.Start(t, tc.opts)
			for _, p := range tc.posts {
				svc.FailNext(1, p.fault)
				_, _ = send(t, nil, svc.URL(), request{key: p.key, body: p.body})
			}
			require.Equal(t, tc.want, svc.Duplicates())
		})
	}
}

func TestOptionsInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts fakeservice.Options
	}{
		{"status not 2xx", fakeservice.Options{Status: 302}},
		{"lookup prefix without a slash", fakeservice.Options{LookupPrefix: "by-key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Panics(t, func() { fakeservice.New(&tc.opts) })
		})
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	svc := fakeservice.New(nil)
	require.Empty(t, svc.URL(), "a Service from New has no server")
	var _ http.Handler = svc
	svc.Close()
	svc.Close()
}

// failedTB is a testing.TB whose test has failed, and that keeps its logs and
// cleanups for the test to look at.
type failedTB struct {
	testing.TB
	logs     []string
	cleanups []func()
}

func (f *failedTB) Helper()                      {}
func (f *failedTB) Failed() bool                 { return true }
func (f *failedTB) Cleanup(fn func())            { f.cleanups = append(f.cleanups, fn) }
func (f *failedTB) Logf(format string, a ...any) { f.logs = append(f.logs, format) }

func TestStartLogsCallsOfAFailedTest(t *testing.T) {
	t.Parallel()
	tb := &failedTB{TB: t}
	var served atomic.Bool
	svc := fakeservice.Start(tb, &fakeservice.Options{AnswerFunc: func(fakeservice.Request) (int, any) {
		served.Store(true)
		return 0, map[string]string{}
	}})
	mustSend(t, svc.URL(), request{key: "k1", body: `{}`})
	require.True(t, served.Load())
	require.Len(t, tb.cleanups, 1)
	tb.cleanups[0]()
	require.Len(t, tb.logs, 2, "the counts, then one line per call")

	_, err := send(t, nil, svc.URL(), request{key: "k1", body: `{}`})
	require.Error(t, err, "the cleanup closed the server")
}
