package httpstep

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// The defaults of Call.
const (
	DefaultKeyHeader = "Idempotency-Key"
	DefaultMaxBody   = 1 << 20
	DefaultTimeout   = 30 * time.Second
)

// CodeMismatch is the code of the halt (engine.Halt) of a step whose CheckFunc
// returned an error that is not a *engine.HaltError.
const CodeMismatch = "answer_mismatch"

// ErrBodyTooLarge is matched by the error of an answer whose body is longer
// than Call.MaxBody. It is a transient failure: the request may well have gone
// through.
var ErrBodyTooLarge = errors.New("httpstep: answer body too large")

// defaultClient sends the requests of every Call whose Client is nil: one for
// the process, so that connections are kept and reused.
var defaultClient = &http.Client{
	Timeout: DefaultTimeout,
	// A redirect is answered as it is: a 301, 302 or 303 would turn the POST
	// into a GET, which would then be taken for the call's answer.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: DefaultTimeout,
		ExpectContinueTimeout: time.Second,
	},
}

// Request is what a Call sends.
type Request struct {
	// Method defaults to POST for the call (a lookup always GETs).
	Method string
	// URL is where the request goes. Required.
	URL string
	// Body is encoded with encoding/json and sent with the Content-Type
	// application/json (unless Header names another). Nil sends no body.
	Body any
	// Header is sent with the request, after Call.Header: its values replace
	// those of the same name. The key header is set last, whatever Header says.
	Header http.Header
}

// Answer is what came back for one request: its status, header and body, and
// the method and URL of the request, for error texts.
type Answer struct {
	// Method and URL are the request's (the URL without a password).
	Method string
	URL    string
	// StatusCode is the answer's HTTP status, such as 200.
	StatusCode int
	Header     http.Header
	// Body is the whole body, at most Call.MaxBody bytes.
	Body []byte
}

// Success reports whether the answer's status is 2xx.
func (a Answer) Success() bool { return a.StatusCode >= 200 && a.StatusCode <= 299 }

// Call describes an idempotent HTTP call: the request an attempt sends under
// the step's derived key, what its answer means, and how to look up by that key
// whether a call was made. Step turns it into an external step; Run and Find
// are that step's function and lookup, which a program outside an engine, or
// a test of the call, can call too.
type Call[In, S any] struct {
	// Client sends the requests. It should have a timeout. Defaults to a client
	// shared by the package's calls, with a timeout of DefaultTimeout, dials
	// within 5 seconds, idle connections kept for reuse, and redirects not
	// followed (a 3xx is an answer, which Classify takes as transient).
	Client *http.Client
	// KeyHeader is the header that carries the derived key (engine.Attempt.Key)
	// on every request, the lookup's too. Defaults to "Idempotency-Key".
	KeyHeader string
	// Header is sent with every request, the call's and the lookup's, such as an
	// Authorization header. Request.Header adds to it (and its values replace
	// those of the same name).
	Header http.Header
	// MaxBody bounds how much of an answer's body is read: a longer body fails
	// the attempt (ErrBodyTooLarge), transiently. Defaults to 1 MiB.
	MaxBody int64
	// RequestFunc builds the request of an attempt. Its error is the attempt's,
	// as it is: nothing was sent. Required.
	RequestFunc func(ctx context.Context, at engine.Attempt, in In, s *S) (Request, error)
	// ClassifyFunc says what an answer means: nil for a success, an error for
	// a failure (see engine: Fail, Halt, RetryAfter; any other error is
	// transient). It sees every answer, successes too. Defaults to Classify;
	// wrap Classify to change what it says of some answers.
	ClassifyFunc func(a Answer) error
	// DecodeFunc reads an answer that ClassifyFunc took for a success into the
	// state. Its error is the attempt's: the call went through, so return
	// engine.Halt for an answer nobody may act on, and a plain (transient) error
	// for one that cannot be read, so that the next attempt asks the lookup;
	// never engine.Fail, which would undo the steps before on a guess. Nil
	// reads nothing.
	DecodeFunc func(at engine.Attempt, in In, s *S, a Answer) error
	// CheckFunc compares the call that DecodeFunc (or Lookup.DecodeFunc) read
	// into the state with the one the input asks for: a provider that answers,
	// under a key, the call made under it before may answer one made for
	// another amount. Any error halts the operation: a *engine.HaltError as it
	// is, another with the code CodeMismatch and the error's text. Nil checks
	// nothing.
	CheckFunc func(in In, s *S) error
	// Lookup, when set, is the step's lookup: how to ask the service whether a
	// call was made under the derived key. Without one, an attempt whose outcome
	// is unknown parks the operation once the step is out of attempts.
	Lookup *Lookup[In, S]
}

// Lookup describes how to ask, by derived key, whether an earlier attempt of a
// Call went through: a GET of the URL that shows the call made under the key.
type Lookup[In, S any] struct {
	// URLFunc returns the URL of the call made under at.Key, such as
	// base+"/payments/by-key/"+url.PathEscape(at.Key). Required.
	URLFunc func(at engine.Attempt, in In, s *S) string
	// NotFoundFunc reports whether a 404 answer is the service's own "no call
	// under this key". Only then is the call taken as not made: any other 404
	// (a wrong URL, a proxy's page) is an error, or a lookup would have steps
	// undone although the call went through. Required: HasCode makes one from
	// the service's error code; AnyNotFound takes every 404 as not made, for a
	// service that says nothing more.
	NotFoundFunc func(a Answer) bool
	// DecodeFunc reads a 2xx answer, the call found, into the state; its error
	// is the lookup's. Defaults to Call.DecodeFunc.
	DecodeFunc func(at engine.Attempt, in In, s *S, a Answer) error
}

// Step returns an external step named name that makes the call c: each attempt
// sends c's request with the derived key in c.KeyHeader, and ClassifyFunc and
// DecodeFunc say what came back. With c.Lookup, the step's lookup asks by key
// whether an earlier attempt went through (see Find). The step's Compensate and
// Retries can be chained as on any external step.
//
// Step panics when c is invalid (no RequestFunc, a Lookup without URLFunc, a
// negative MaxBody): a mistake in the program, found where the operation is
// declared. It copies c, so changing c later does not change the step.
func Step[In, S any](name string, c Call[In, S]) engine.ExternalStepDef[In, S] {
	if err := c.validate(); err != nil {
		panic(fmt.Sprintf("httpstep: step %q: %s", name, err))
	}
	c = c.withDefaults()
	step := engine.ExternalStep(name, c.Run)
	if c.Lookup != nil {
		step = step.Lookup(c.Find)
	}
	return step
}

func (c Call[In, S]) validate() error {
	switch {
	case c.RequestFunc == nil:
		return errors.New("a RequestFunc is required")
	case c.Lookup != nil && c.Lookup.URLFunc == nil:
		return errors.New("a Lookup needs a URLFunc")
	case c.Lookup != nil && c.Lookup.NotFoundFunc == nil:
		return errors.New("a Lookup needs a NotFoundFunc: only it can tell the service's own 404 (no call under the key) from a wrong URL's, which says nothing of the call (httpstep.HasCode, or httpstep.AnyNotFound)")
	case c.MaxBody < 0:
		return errors.New("MaxBody must not be negative")
	}
	return nil
}

// withDefaults returns c with its defaults, and copies of what c shares with
// its caller.
func (c Call[In, S]) withDefaults() Call[In, S] {
	if c.Client == nil {
		c.Client = defaultClient
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.ClassifyFunc == nil {
		c.ClassifyFunc = Classify
	}
	c.Header = c.Header.Clone()
	if c.Lookup != nil {
		l := *c.Lookup
		if l.DecodeFunc == nil {
			l.DecodeFunc = c.DecodeFunc
		}
		c.Lookup = &l
	}
	return c
}

// Run makes one attempt of the call: what the step of Step runs. It builds the
// request (RequestFunc), sends it under at.Key (an empty key sends no key
// header), and returns what ClassifyFunc makes of the answer; a success is read
// by DecodeFunc and checked by CheckFunc. A request that cannot be sent (a
// refused connection, a timeout) or an answer that cannot be read, or is over
// MaxBody, is a transient failure; a request that cannot be made (a body that does not
// encode, a bad URL) is a permanent one (engine.Permanent), after which the
// engine asks the lookup before anything is undone. A refusal (engine.Fail) of
// a repeated attempt of a call without a Lookup halts the operation instead
// (engine.Halt): an earlier attempt may have gone through.
func (c Call[In, S]) Run(ctx context.Context, at engine.Attempt, in In, s *S) error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("httpstep: %s", err)
	}
	c = c.withDefaults()
	req, err := c.RequestFunc(ctx, at, in, s)
	if err != nil {
		return err
	}
	hreq, err := c.newRequest(ctx, at, req, http.MethodPost)
	if err != nil {
		return engine.Permanent(err)
	}
	a, err := c.send(hreq)
	if err != nil {
		return err
	}
	if err := c.ClassifyFunc(a); err != nil {
		var pe *engine.PermanentError
		if at.Number > 1 && c.Lookup == nil && errors.As(err, &pe) && !pe.ServerFault() {
			// An earlier attempt's answer may have been lost after the call
			// went through, and without a lookup nothing can tell: a refusal
			// now (the account drained by that call, say) is no proof that
			// nothing was done, so nothing may be undone on it.
			return engine.Halt(string(pe.Code), "the service refused a repeated attempt, and without a lookup nothing tells whether an earlier one went through: "+pe.Message)
		}
		return err
	}
	return c.decode(c.DecodeFunc, at, in, s, a)
}

// Find asks whether a call was made under at.Key: what the lookup of Step runs.
// It GETs Lookup.URLFunc's URL, with at.Key in the key header too. A 2xx is the
// call found: Lookup.DecodeFunc reads it into the state, CheckFunc compares it
// with the input, and Find returns true. A 404 is the call not made (false, no
// error), when Lookup.NotFoundFunc says it is the service's own;
// every other answer, and a request that fails, is an error, transient (with
// the answer's Retry-After), never a permanent one: a lookup that cannot tell
// must not let the engine undo anything.
func (c Call[In, S]) Find(ctx context.Context, at engine.Attempt, in In, s *S) (bool, error) {
	if err := c.validate(); err != nil {
		return false, fmt.Errorf("httpstep: %s", err)
	}
	if c.Lookup == nil {
		return false, errors.New("httpstep: the call has no Lookup")
	}
	c = c.withDefaults()
	hreq, err := c.newRequest(ctx, at, Request{Method: http.MethodGet, URL: c.Lookup.URLFunc(at, in, s)}, http.MethodGet)
	if err != nil {
		return false, err
	}
	a, err := c.send(hreq)
	if err != nil {
		return false, err
	}
	switch {
	case a.StatusCode == http.StatusNotFound && c.Lookup.NotFoundFunc(a):
		return false, nil
	case a.Success():
		if err := c.decode(c.Lookup.DecodeFunc, at, in, s, a); err != nil {
			return false, err
		}
		return true, nil
	}
	return false, transient(a)
}

// decode reads a successful answer into the state with fn, then checks it.
func (c Call[In, S]) decode(fn func(at engine.Attempt, in In, s *S, a Answer) error, at engine.Attempt, in In, s *S, a Answer) error {
	if fn != nil {
		if err := fn(at, in, s, a); err != nil {
			return fmt.Errorf("httpstep: read the answer of %s %s: %w", a.Method, a.URL, err)
		}
	}
	if c.CheckFunc == nil {
		return nil
	}
	err := c.CheckFunc(in, s)
	if err == nil {
		return nil
	}
	var halt *engine.HaltError
	if errors.As(err, &halt) {
		return halt
	}
	return engine.Halt(CodeMismatch, fmt.Sprintf("%s %s answered %d, a call that does not match the request: %s",
		a.Method, a.URL, a.StatusCode, err))
}

// newRequest makes the HTTP request of req, under at.Key.
func (c Call[In, S]) newRequest(ctx context.Context, at engine.Attempt, req Request, method string) (*http.Request, error) {
	if req.URL == "" {
		return nil, errors.New("httpstep: the request has no URL")
	}
	if req.Method != "" {
		method = req.Method
	}
	var body io.Reader
	if req.Body != nil {
		raw, err := json.Marshal(req.Body)
		if err != nil {
			return nil, fmt.Errorf("httpstep: encode the body of %s %s: %w", method, req.URL, err)
		}
		// A bytes.Reader, so that the transport can send the body again (a
		// request with an idempotency key is one it may retry on a dead
		// connection).
		body = bytes.NewReader(raw)
	}
	hreq, err := http.NewRequestWithContext(ctx, method, req.URL, body)
	if err != nil {
		return nil, fmt.Errorf("httpstep: %w", err)
	}
	for _, h := range []http.Header{c.Header, req.Header} {
		for name, values := range h {
			hreq.Header.Del(name)
			for _, v := range values {
				hreq.Header.Add(name, v)
			}
		}
	}
	if req.Body != nil && hreq.Header.Get("Content-Type") == "" {
		hreq.Header.Set("Content-Type", "application/json")
	}
	if hreq.Header.Get("Accept") == "" {
		hreq.Header.Set("Accept", "application/json")
	}
	hreq.Header.Del(c.KeyHeader)
	if at.Key != "" {
		hreq.Header.Set(c.KeyHeader, at.Key)
	}
	return hreq, nil
}

// send sends req and reads its answer, at most MaxBody bytes of it.
func (c Call[In, S]) send(req *http.Request) (Answer, error) {
	resp, err := c.Client.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("httpstep: %w", err) // a *url.Error, which names the method and the URL
	}
	// A body read to its end leaves the connection for the next request; one
	// that is too long is closed unread, and its connection with it.
	defer func() { _ = resp.Body.Close() }()
	a := Answer{Method: req.Method, URL: req.URL.Redacted(), StatusCode: resp.StatusCode, Header: resp.Header}
	a.Body, err = io.ReadAll(io.LimitReader(resp.Body, c.MaxBody+1))
	if err != nil {
		return a, fmt.Errorf("httpstep: read the answer of %s %s (%d): %w", a.Method, a.URL, a.StatusCode, err)
	}
	if int64(len(a.Body)) > c.MaxBody {
		return a, fmt.Errorf("%w: %s %s answered %d with more than %d bytes", ErrBodyTooLarge, a.Method, a.URL, a.StatusCode, c.MaxBody)
	}
	return a, nil
}
