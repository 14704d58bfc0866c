package fakeservice

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The defaults of Options.
const (
	DefaultKeyHeader    = "Idempotency-Key"
	DefaultLookupPrefix = "/by-key"
	DefaultStatus       = http.StatusCreated
	DefaultTimeoutDelay = 30 * time.Second
)

// maxBody bounds the body of a POST.
const maxBody = 1 << 20

// Options configures a Service. A nil *Options, and the zero value of every
// field, take the defaults.
type Options struct {
	// KeyHeader is the request header that carries the idempotency key.
	// Defaults to "Idempotency-Key".
	KeyHeader string
	// LookupPrefix is the path under which GET <LookupPrefix>/<key> looks a key
	// up. It starts with "/"; a trailing "/" is dropped. Defaults to "/by-key".
	LookupPrefix string
	// Status is the status of the answer to a request that takes effect, when
	// AnswerFunc is nil or returns the status 0. It must be a 2xx status.
	// Defaults to 201 Created.
	Status int
	// AnswerFunc, when set, builds the answer of a first request under a key
	// instead of the default {"id", "key", "request"} object: body is encoded as
	// JSON (a json.RawMessage or []byte as it is). A 2xx status takes effect; any
	// other is a refusal, which takes no effect and stores nothing (see the
	// package documentation, "Refusals"); 0 means Status. It is called for one
	// request of a key at a time, and may call the Service's methods.
	AnswerFunc func(req Request) (status int, body any)
	// FaultFunc, when set, chooses the fault of each keyed POST with a JSON body,
	// and of each lookup (req.Method tells which), that finds the queue of
	// FailNext empty. attempt counts the requests of that kind under req.Key,
	// this one included, from 1. FaultNone (0) lets the request through. It may
	// call the Service's methods.
	FaultFunc func(req Request, attempt int) Fault
	// TimeoutDelay is the longest that FaultTimeout holds an answer back: longer
	// than the client's timeout, so that the client gives up first. Defaults to
	// 30 seconds.
	TimeoutDelay time.Duration
}

// withDefaults returns a copy of opts with the defaults filled in, or panics on
// an invalid option.
func (opts *Options) withDefaults() Options {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.KeyHeader == "" {
		o.KeyHeader = DefaultKeyHeader
	}
	if o.LookupPrefix == "" {
		o.LookupPrefix = DefaultLookupPrefix
	}
	o.LookupPrefix = strings.TrimSuffix(o.LookupPrefix, "/")
	if !strings.HasPrefix(o.LookupPrefix, "/") {
		panic(fmt.Sprintf("fakeservice: Options.LookupPrefix %q does not start with /", o.LookupPrefix))
	}
	if o.Status == 0 {
		o.Status = DefaultStatus
	}
	if !success(o.Status) {
		panic(fmt.Sprintf("fakeservice: Options.Status %d is not a 2xx status", o.Status))
	}
	if o.TimeoutDelay <= 0 {
		o.TimeoutDelay = DefaultTimeoutDelay
	}
	return o
}

// Request is a request as the Service received it.
type Request struct {
	// Method is "POST", or "GET" for a lookup.
	Method string
	// Path is the request's URL path.
	Path string
	// Key is the idempotency key: the key header of a POST, the looked up key of
	// a lookup.
	Key string
	// Header is the request's header.
	Header http.Header
	// Body is the body of a POST, as sent; nil for a lookup.
	Body json.RawMessage
}

// clone returns a copy of r that shares nothing with it.
func (r Request) clone() Request {
	r.Header = r.Header.Clone()
	if r.Body != nil {
		r.Body = append(json.RawMessage(nil), r.Body...)
	}
	return r
}

// Call is a POST received under a key and how it was answered.
type Call struct {
	Request
	// Attempt counts the POSTs under the key, this one included, from 1.
	Attempt int
	// Status is the status of the answer: the one written, or for
	// FaultLostResponse and FaultTimeout the one the client did not hear.
	Status int
	// Effect says whether this call took effect (at most one call per key).
	Effect bool
	// Replayed says whether the answer was the stored one of an earlier call.
	Replayed bool
	// Fault is the fault injected into the call, FaultNone for none.
	Fault Fault
}

// Service is a fake external service: an http.Handler that serves the package's
// protocol from memory. It is safe for concurrent use. Make one with New or
// Start.
type Service struct {
	opts   Options
	server *httptest.Server // set by Start

	closeOnce sync.Once
	closed    chan struct{}

	mu           sync.Mutex
	keys         map[string]*keyState
	lookupsByKey map[string]int
	bodies       map[string]int // POSTs with a JSON body, by canonical body
	made         []effect       // in the order they took effect
	ids          int            // the ids of default answers given
	requests     int
	lookups      int
	postFaults   []Fault
	lookupFaults int
}

// keyState is what the Service knows of one key. Its fields are guarded by
// Service.mu.
type keyState struct {
	// turn makes the POSTs under the key take turns; it is taken before
	// Service.mu, never while holding it.
	turn  sync.Mutex
	calls []Call
	// made says whether a call took effect; then canonical is its body's
	// canonical form, status and answer its answer.
	made      bool
	canonical string
	status    int
	answer    []byte
}

// effect is a call that took effect.
type effect struct {
	key       string
	canonical string
	body      json.RawMessage
}

// New returns a Service with opts (nil: the defaults), to serve with a server
// of the caller's; Start serves one for a test. New panics on invalid options.
func New(opts *Options) *Service {
	return &Service{
		opts:         opts.withDefaults(),
		closed:       make(chan struct{}),
		keys:         make(map[string]*keyState),
		lookupsByKey: make(map[string]int),
		bodies:       make(map[string]int),
	}
}

// Close ends at once the holds of FaultTimeout in progress, and makes later
// ones drop their connection without waiting, so that a server serving the
// Service can shut down. A Service from Start also closes its server. Close
// may be called more than once.
func (s *Service) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
	if s.server != nil {
		s.server.Close()
	}
}

// ServeHTTP serves the package's protocol.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// See the package documentation, "Connections".
	w.Header().Set("Connection", "close")
	switch r.Method {
	case http.MethodPost:
		s.post(w, r)
	case http.MethodGet:
		key, ok := strings.CutPrefix(r.URL.Path, s.opts.LookupPrefix+"/")
		if !ok || key == "" {
			writeError(w, http.StatusNotFound, "no_route", "no such route: GET "+r.URL.Path)
			return
		}
		s.lookup(w, r, key)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not served")
	}
}

// post serves a POST.
func (s *Service) post(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()

	key := r.Header.Get(s.opts.KeyHeader)
	if key == "" {
		writeError(w, http.StatusBadRequest, "missing_idempotency_key", "the "+s.opts.KeyHeader+" header is required")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	req := Request{Method: r.Method, Path: r.URL.Path, Key: key, Header: r.Header.Clone(), Body: body}
	var canonical string
	var invalid []byte
	if err != nil {
		invalid = errorBody("invalid_body", "the body could not be read: "+err.Error())
	} else if canonical, err = canonicalJSON(body); err != nil {
		invalid = errorBody("invalid_body", "the body is not JSON: "+err.Error())
	}

	call, answer := s.handle(req, canonical, invalid)
	switch call.Fault {
	case FaultLostResponse:
		drop(w)
	case FaultTimeout:
		s.hold(r)
		drop(w)
	default:
		if call.Fault == FaultError {
			w.Header().Set("Retry-After", "0")
		}
		if call.Replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		writeJSON(w, call.Status, answer)
	}
}

// handle decides the answer of a keyed POST and records it, with the POSTs
// under its key taking turns. invalid, when not nil, is the 400 answer of a body
// that is not JSON; else canonical is the body's canonical form. The caller
// injects call.Fault.
func (s *Service) handle(req Request, canonical string, invalid []byte) (Call, []byte) {
	s.mu.Lock()
	e := s.keys[req.Key]
	if e == nil {
		e = &keyState{}
		s.keys[req.Key] = e
	}
	s.mu.Unlock()

	e.turn.Lock()
	defer e.turn.Unlock()

	call := Call{Request: req}
	s.mu.Lock()
	call.Attempt = len(e.calls) + 1
	if invalid != nil {
		call.Status = http.StatusBadRequest
		e.calls = append(e.calls, call)
		s.mu.Unlock()
		return call, invalid
	}
	queued := len(s.postFaults) > 0
	if queued {
		call.Fault = s.postFaults[0]
		s.postFaults = s.postFaults[1:]
	}
	s.mu.Unlock()
	if !queued && s.opts.FaultFunc != nil {
		call.Fault = s.opts.FaultFunc(req.clone(), call.Attempt)
	}

	var answer []byte
	switch {
	case !call.Fault.valid():
		call.Status = http.StatusInternalServerError
		answer = errorBody("invalid_fault", fmt.Sprintf("fakeservice: Options.FaultFunc returned %v", call.Fault))
	case call.Fault == FaultError || call.Fault == FaultLookupError:
		call.Status = http.StatusServiceUnavailable
		answer = errorBody("unavailable", "fakeservice: injected fault")
	default:
		s.mu.Lock()
		made, stored := e.made, e.canonical
		call.Status, answer = e.status, e.answer
		s.mu.Unlock()
		switch {
		case made && stored == canonical:
			call.Replayed = true
		case made:
			call.Status = http.StatusUnprocessableEntity
			answer = errorBody("idempotency_key_reused", "the key "+strconv.Quote(req.Key)+" was used with another body")
		default:
			call.Status, answer = s.answer(req)
			if success(call.Status) {
				call.Effect = true
			}
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if call.Effect {
		e.made, e.canonical, e.status, e.answer = true, canonical, call.Status, answer
		s.made = append(s.made, effect{key: req.Key, canonical: canonical, body: req.Body})
	}
	s.bodies[canonical]++
	e.calls = append(e.calls, call)
	return call, answer
}

// answer builds the answer of a first request under a key.
func (s *Service) answer(req Request) (int, []byte) {
	if s.opts.AnswerFunc == nil {
		s.mu.Lock()
		s.ids++
		id := "fs_" + strconv.Itoa(s.ids)
		s.mu.Unlock()
		b, err := json.Marshal(struct {
			ID      string          `json:"id"`
			Key     string          `json:"key"`
			Request json.RawMessage `json:"request"`
		}{id, req.Key, req.Body})
		if err != nil { // the body was checked: cannot happen
			panic(err)
		}
		return s.opts.Status, b
	}
	status, body := s.opts.AnswerFunc(req.clone())
	if status == 0 {
		status = s.opts.Status
	}
	var b []byte
	var err error
	switch body := body.(type) {
	case json.RawMessage:
		b, err = body, checkJSON(body)
	case []byte:
		b, err = body, checkJSON(body)
	default:
		b, err = json.Marshal(body)
	}
	if err != nil {
		return http.StatusInternalServerError, errorBody("invalid_answer", "fakeservice: Options.AnswerFunc's body: "+err.Error())
	}
	return status, append([]byte(nil), b...)
}

// lookup serves GET <prefix>/<key>.
func (s *Service) lookup(w http.ResponseWriter, r *http.Request, key string) {
	req := Request{Method: r.Method, Path: r.URL.Path, Key: key, Header: r.Header.Clone()}
	s.mu.Lock()
	s.lookups++
	s.lookupsByKey[key]++
	attempt := s.lookupsByKey[key]
	var fault Fault
	queued := s.lookupFaults > 0
	if queued {
		s.lookupFaults--
		fault = FaultLookupError
	}
	s.mu.Unlock()
	if !queued && s.opts.FaultFunc != nil {
		fault = s.opts.FaultFunc(req.clone(), attempt)
	}

	switch fault {
	case FaultNone:
	case FaultError, FaultLookupError:
		w.Header().Set("Retry-After", "0")
		writeError(w, http.StatusServiceUnavailable, "unavailable", "fakeservice: injected fault")
		return
	case FaultLostResponse:
		drop(w)
		return
	case FaultTimeout:
		s.hold(r)
		drop(w)
		return
	default:
		writeError(w, http.StatusInternalServerError, "invalid_fault", fmt.Sprintf("fakeservice: Options.FaultFunc returned %v", fault))
		return
	}

	s.mu.Lock()
	var answer []byte
	if e := s.keys[key]; e != nil && e.made {
		answer = e.answer
	}
	s.mu.Unlock()
	if answer == nil {
		writeError(w, http.StatusNotFound, "not_found", "nothing was made under the key "+strconv.Quote(key))
		return
	}
	writeJSON(w, http.StatusOK, answer)
}

// hold waits, for FaultTimeout, until the request's context ends, the
// TimeoutDelay has passed or the Service is closed.
func (s *Service) hold(r *http.Request) {
	t := time.NewTimer(s.opts.TimeoutDelay)
	defer t.Stop()
	select {
	case <-r.Context().Done():
	case <-t.C:
	case <-s.closed:
	}
}

// drop ends the request without an answer: it closes the connection, so that
// the client reads no answer, only an error.
func drop(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	// HTTP/2, or a writer that cannot hijack: abort the response instead.
	panic(http.ErrAbortHandler)
}

// success reports whether status is a 2xx status.
func success(status int) bool { return status >= 200 && status <= 299 }

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorBody(code, message))
}

// errorBody returns {"code": code, "message": message}.
func errorBody(code, message string) []byte {
	b, err := json.Marshal(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, message})
	if err != nil { // two strings: cannot happen
		panic(err)
	}
	return b
}
