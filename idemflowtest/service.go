package idemflowtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// Service is an outside service that a Run's operation calls over HTTP, and
// how it words the outcomes the matrices make it give. The kit serves a proxy
// in front of it, in the test process, and hands the operation the proxy's URL
// in its place (see Run.Services): every fault is then an answer, or a
// silence, that the operation's own client reads and its own code decodes.
//
// The proxy tells a step's requests by the step's derived key, in KeyHeader or
// as a segment of the URL's path; a GET is a lookup, any other method a call.
// Requests under no step's key pass through.
type Service struct {
	// KeyHeader is the request header that carries the derived key. Defaults
	// to "Idempotency-Key".
	KeyHeader string
	// Declined is the service's answer to a call it declines (a card refused,
	// an account closed): FaultDeclined answers it to every call under the
	// step's key, which takes no effect. Nil: FaultDeclined is not tried.
	Declined func(key string) Answer
	// Pending is the service's answer to a call it accepts with its outcome
	// to come, and LookupPending its lookup's answer while that call is
	// pending. Nil (either): the pending faults are not tried.
	Pending       func(key string) Answer
	LookupPending func(key string) Answer
	// LookupFailed is the lookup's answer for a pending call that failed:
	// what FaultPendingFailed ends with. Nil: FaultPendingFailed is not tried.
	LookupFailed func(key string) Answer
}

// Answer is an HTTP answer that the kit's proxy gives in a Service's name.
type Answer struct {
	// Status is the answer's HTTP status, such as 402.
	Status int
	// Body is sent as it is, as application/json.
	Body string
}

// The timings of the outcome faults.
const (
	// holdMax bounds how long the proxy holds an answer back for a client
	// that does not give up: a call without a timeout.
	holdMax = 20 * time.Second
	// landMax bounds how long after its call gave up a late landing waits for
	// the edge of a long settle window.
	landMax = 10 * time.Second
)

// plan is the fault of one run of a matrix, shared by the proxies of its
// Services: which step, which fault, and what happened.
type plan struct {
	ctx   context.Context
	step  string
	fault Fault

	mu sync.Mutex
	// info reads the run's operation, once an engine can (nil before).
	info func(ctx context.Context) (*engine.Info, error)
	// keys are the derived keys of the operation's external steps, by key.
	keys map[string]string
	// calls counts the calls seen under the step's key.
	calls int
	// pendingLookups counts the lookups answered "pending"; pendingUntil is
	// when a pending call may be settled, once one was.
	pendingLookups int
	pendingUntil   time.Time
	// landed is set once a late call has landed.
	landed bool
	// injected is set once the fault was injected.
	injected bool
	// problems are what the kit finds wrong beside the books.
	problems []error
}

func (pl *plan) setInfo(fn func(ctx context.Context) (*engine.Info, error)) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.info = fn
}

func (pl *plan) problem(err error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.problems = append(pl.problems, err)
}

// result returns what the kit found wrong, and an error when a fault was
// planned but never injected.
func (pl *plan) result() error {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	errs := append([]error(nil), pl.problems...)
	if pl.fault != "" && !pl.injected {
		errs = append(errs, fmt.Errorf("idemflowtest: the fault %s was not injected: no call under step %s's key reached a Service of Run.Services, or the Service lacks the answers it needs", pl.fault, pl.step))
	}
	return errors.Join(errs...)
}

// stepOf returns the step whose derived key is one of keys, or "".
func (pl *plan) stepOf(ctx context.Context, keys []string) (string, string) {
	for range 2 {
		pl.mu.Lock()
		for _, k := range keys {
			if s, ok := pl.keys[k]; ok {
				pl.mu.Unlock()
				return s, k
			}
		}
		info := pl.info
		pl.mu.Unlock()
		if info == nil {
			return "", ""
		}
		// A key not seen yet: the operation may have been reserved since.
		op, err := info(ctx)
		if err != nil {
			return "", ""
		}
		pl.mu.Lock()
		pl.keys = map[string]string{}
		for _, s := range op.Steps {
			if s.DerivedKey != "" {
				pl.keys[s.DerivedKey] = s.Name
			}
		}
		pl.mu.Unlock()
	}
	return "", ""
}

// proxy serves one Service in front of its real URL, for a plan.
type proxy struct {
	svc    Service
	target *url.URL
	plan   *plan
	client *http.Client
}

// startProxy serves a proxy in front of the service at rawURL for t, and
// returns the URL to give the operation in its place.
func startProxy(t *testing.T, name, rawURL string, svc Service, pl *plan) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		t.Fatalf("idemflowtest: Run.Services names %q, whose Env value %q is not an absolute http URL", name, rawURL)
	}
	if svc.KeyHeader == "" {
		svc.KeyHeader = "Idempotency-Key"
	}
	p := &proxy{svc: svc, target: u, plan: pl, client: &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL + strings.TrimSuffix(u.Path, "/")
}

// ServeHTTP forwards r to the service, or injects the plan's fault.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now() // the client's timeout runs from before it
	w.Header().Set("Connection", "close")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		drop(w)
		return
	}
	keys := []string{r.Header.Get(p.svc.KeyHeader)}
	for _, seg := range strings.Split(r.URL.EscapedPath(), "/") {
		if k, err := url.PathUnescape(seg); err == nil && k != "" {
			keys = append(keys, k)
		}
	}
	pl := p.plan
	if pl.fault == "" {
		p.pass(w, r, body)
		return
	}
	step, key := pl.stepOf(r.Context(), keys)
	if step == "" || step != pl.step {
		p.pass(w, r, body)
		return
	}
	if r.Method == http.MethodGet {
		p.lookup(w, r, body, key)
		return
	}
	pl.mu.Lock()
	pl.calls++
	first := pl.calls == 1
	pl.mu.Unlock()

	switch pl.fault {
	case FaultError, FaultLostResponse, FaultTimeout, FaultLateLanding:
		if !first {
			p.pass(w, r, body)
			return
		}
		p.injected()
		switch pl.fault {
		case FaultError:
			drop(w) // before it reached the service
		case FaultLostResponse:
			_, _ = p.forward(pl.ctx, r, body)
			drop(w)
		case FaultTimeout:
			_, _ = p.forward(pl.ctx, r, body)
			p.hold(r, arrived)
			drop(w)
		case FaultLateLanding:
			timeout := p.hold(r, arrived)
			drop(w)
			p.land(r, body, timeout)
		}
	case FaultDeclined:
		if p.svc.Declined == nil {
			p.pass(w, r, body)
			return
		}
		p.injected()
		writeAnswer(w, p.svc.Declined(key))
	case FaultPending, FaultPendingFailed:
		switch {
		case p.svc.Pending == nil || p.svc.LookupPending == nil || pl.fault == FaultPendingFailed && p.svc.LookupFailed == nil:
			p.pass(w, r, body)
		case !first && pl.fault == FaultPending:
			p.pass(w, r, body) // a replay of the call made
		case !first && p.svc.Declined != nil:
			writeAnswer(w, p.svc.Declined(key)) // it failed: so does a new call under its key
		case !first:
			drop(w)
		default:
			p.injected()
			if pl.fault == FaultPending {
				// The call is made; its answer says pending.
				if _, err := p.forward(pl.ctx, r, body); err != nil {
					drop(w)
					return
				}
			}
			pl.mu.Lock()
			pl.pendingUntil = time.Now().Add(PendingFor)
			pl.mu.Unlock()
			writeAnswer(w, p.svc.Pending(key))
		}
	default:
		p.pass(w, r, body)
	}
}

// lookup answers a lookup under the step's key: "pending" while a pending
// call is, then the service's own answer (pending then succeeded) or the
// failure (pending then failed).
func (p *proxy) lookup(w http.ResponseWriter, r *http.Request, body []byte, key string) {
	pl := p.plan
	if pl.fault != FaultPending && pl.fault != FaultPendingFailed {
		p.pass(w, r, body)
		return
	}
	pl.mu.Lock()
	since := !pl.pendingUntil.IsZero()
	settled := since && pl.pendingLookups > 0 && !time.Now().Before(pl.pendingUntil)
	if since && !settled {
		pl.pendingLookups++
	}
	pl.mu.Unlock()
	switch {
	case !since:
		p.pass(w, r, body) // no call was answered pending yet
	case !settled:
		writeAnswer(w, p.svc.LookupPending(key))
	case pl.fault == FaultPending:
		p.pass(w, r, body)
	default:
		writeAnswer(w, p.svc.LookupFailed(key))
	}
}

func (p *proxy) injected() {
	p.plan.mu.Lock()
	defer p.plan.mu.Unlock()
	p.plan.injected = true
}

// hold holds the answer back until the client gives up (its timeout), at
// most holdMax, and returns how long the client waited since the request
// arrived.
func (p *proxy) hold(r *http.Request, arrived time.Time) time.Duration {
	t := time.NewTimer(holdMax)
	defer t.Stop()
	select {
	case <-r.Context().Done():
	case <-p.plan.ctx.Done():
	case <-t.C:
		p.plan.problem(fmt.Errorf("idemflowtest: step %s's call did not give up in %s without an answer: give its HTTP client a timeout", p.plan.step, holdMax))
	}
	return time.Since(arrived)
}

// land makes the call that the client gave up on land at the service just
// inside the step's settle window, as the database fixed it once the step ran
// out of calls (at most landMax later), and checks that window against the
// call's timeout.
func (p *proxy) land(r *http.Request, body []byte, timeout time.Duration) {
	pl := p.plan
	defer func() {
		pl.mu.Lock()
		pl.landed = true
		pl.mu.Unlock()
	}()
	gaveUp := time.Now()
	tick := time.NewTicker(TestPollInterval)
	defer tick.Stop()
	// sentAt is when the step's window began, by the database's clock;
	// checked, that the window was found shorter than the timeout.
	var settleBy, sentAt time.Time
	checked := false
	for settleBy.IsZero() {
		select {
		case <-pl.ctx.Done():
			return
		case <-tick.C:
		}
		pl.mu.Lock()
		info := pl.info
		pl.mu.Unlock()
		if info == nil {
			continue
		}
		op, err := info(pl.ctx)
		if err != nil {
			continue
		}
		for _, s := range op.Steps {
			if s.Name != pl.step {
				continue
			}
			if s.Window > 0 && s.Window < timeout && !checked {
				// Known from the definition at once: no need to wait for the
				// database to fix the window.
				checked = true
				pl.problem(fmt.Errorf("idemflowtest: step %s's settle window (%s) is shorter than its call's timeout (about %s): a request the service takes as long to carry out as the step waits for its answer lands after the window, and its lookup takes it for not made",
					pl.step, s.Window, timeout.Round(time.Millisecond)))
			}
			if s.Status == engine.StepStatusRunning || s.Status == engine.StepStatusNotStarted {
				break // still calling: its window is not fixed yet
			}
			// Out of calls (waiting), or ended: the window is the one the
			// database fixed when its last call failed, from its clock at
			// that moment (waiting since, or finished at).
			settleBy = time.Now()
			if s.SettleBy != nil {
				settleBy = *s.SettleBy
				for _, at := range []*time.Time{s.WaitingSince, s.FinishedAt, s.SentAt} {
					if at != nil {
						sentAt = *at
						break
					}
				}
			}
		}
		if op.Status != engine.StatusInProgress && settleBy.IsZero() {
			settleBy = time.Now()
		}
	}
	if !sentAt.IsZero() && !checked {
		if window := settleBy.Sub(sentAt); window < timeout {
			pl.problem(fmt.Errorf("idemflowtest: step %s's settle window (about %s, by its settleBy) is shorter than its call's timeout (about %s): a request the service takes as long to carry out as the step waits for its answer lands after the window, and its lookup takes it for not made",
				pl.step, window.Round(time.Millisecond), timeout.Round(time.Millisecond)))
		}
	}
	// Just inside the window: a quarter of it, at most 250ms, before its end.
	window := settleBy.Sub(sentAt)
	margin := min(max(window/4, time.Millisecond), 250*time.Millisecond)
	at := settleBy.Add(-margin)
	if limit := gaveUp.Add(landMax); at.After(limit) {
		at = limit
	}
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-pl.ctx.Done():
			return
		case <-t.C:
		}
	}
	if _, err := p.forward(pl.ctx, r, body); err != nil {
		pl.problem(fmt.Errorf("idemflowtest: the late call of step %s could not land: %w", pl.step, err))
	}
}

// landed reports whether the late call has landed.
func (pl *plan) hasLanded() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.landed
}

// pass forwards r to the service and its answer to the client.
func (p *proxy) pass(w http.ResponseWriter, r *http.Request, body []byte) {
	resp, err := p.forward(r.Context(), r, body)
	if err != nil {
		drop(w)
		return
	}
	for k, vs := range resp.header {
		if k == "Connection" || k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

type answered struct {
	status int
	header http.Header
	body   []byte
}

// forward sends r to the service with ctx and reads its answer.
func (p *proxy) forward(ctx context.Context, r *http.Request, body []byte) (*answered, error) {
	out, err := http.NewRequestWithContext(ctx, r.Method, p.target.Scheme+"://"+p.target.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Connection")
	resp, err := p.client.Do(out)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &answered{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// writeAnswer writes a.
func writeAnswer(w http.ResponseWriter, a Answer) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.Status)
	_, _ = io.WriteString(w, a.Body)
}

// drop ends the request without an answer: the client reads an error.
func drop(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}
