package opsweb

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/bearer"
)

// The defaults of Config.
const (
	DefaultBasePath      = "/ops"
	DefaultReadTimeout   = 8 * time.Second
	DefaultActionTimeout = 15 * time.Second
	// DefaultRunbookURL is idemflow's runbook, which has a section per
	// attention code of the engine and per mismatch kind (and the demo's
	// refund codes).
	DefaultRunbookURL = "https://github.com/idemflow/idemflow/blob/main/docs/runbook.md"
)

// Config configures the handler of New.
type Config struct {
	// AuthFunc authenticates every request, before anything else is read: a
	// nil error lets it through, any other answers 401 unauthenticated (its
	// text is not shown). Required: operators' pages retry and cancel
	// operations of every client. TokenAuth makes one for a shared secret.
	AuthFunc func(r *http.Request) error
	// BasePath is where the pages are: BasePath lists operations and
	// BasePath+"/operations/{id}" shows one. An absolute, clean path without
	// a trailing slash, not "/". Defaults to "/ops".
	BasePath string
	// APIPath is where the JSON API is: APIPath+"/operations" and below. The
	// same rules as BasePath's, and another path. Defaults to BasePath+"/api".
	APIPath string
	// ReadTimeout bounds the database reads of a request: a database that
	// does not answer by then gets 503 service_unavailable. Defaults to 8
	// seconds.
	ReadTimeout time.Duration
	// ActionTimeout bounds a retry, a cancel or a resolve, which may ask an
	// outside service by derived key and run compensations, an approval or a
	// rejection, and a reconciliation run that an operator asks for; the
	// action goes on if the client goes away meanwhile. Defaults to 15
	// seconds.
	ActionTimeout time.Duration
	// Logger receives a line per operator's request (retry, cancel, resolve,
	// approve, reject), and the errors the handler could not answer with.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// ReferenceField names the member of a resolve's body, and the field of
	// its form, that holds the reference of what a made call made (see
	// engine.Engine.Resolve), such as "providerRefundId". Defaults to
	// "reference".
	ReferenceField string
	// ReconcileSources names the engine's reconciliation sources (the names
	// of reconcile.Config.Sources), which the reconciliation page
	// reports on and offers to run: the engine does not list them. A source
	// left out still shows once a mismatch of its own names it. Defaults to
	// none.
	ReconcileSources []string
	// RunbookURL is the operators' runbook: the operation page links an
	// attention code, and the pages a mismatch kind, to RunbookURL#<code>
	// (the code as written, such as #outcome_overdue or #not_succeeded), and
	// a refused request's answer names that link. An absolute http(s) URL,
	// or a path on this server, without a fragment. A service whose steps
	// halt with codes of their own (engine.Halt) documents them under those
	// anchors in a runbook of its own, and sets this to it. Defaults to
	// DefaultRunbookURL.
	RunbookURL string
}

func (c *Config) withDefaults() Config {
	out := *c
	out.ReconcileSources = slices.Clone(c.ReconcileSources)
	if out.BasePath == "" {
		out.BasePath = DefaultBasePath
	}
	if out.APIPath == "" {
		out.APIPath = out.BasePath + "/api"
	}
	if out.ReadTimeout <= 0 {
		out.ReadTimeout = DefaultReadTimeout
	}
	if out.ActionTimeout <= 0 {
		out.ActionTimeout = DefaultActionTimeout
	}
	if out.ReferenceField == "" {
		out.ReferenceField = "reference"
	}
	if out.RunbookURL == "" {
		out.RunbookURL = DefaultRunbookURL
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	if c.AuthFunc == nil {
		return errors.New("opsweb: Config.AuthFunc is required")
	}
	for _, p := range []struct{ name, value string }{{"BasePath", c.BasePath}, {"APIPath", c.APIPath}} {
		if !strings.HasPrefix(p.value, "/") || p.value == "/" || path.Clean(p.value) != p.value ||
			strings.ContainsAny(p.value, "{}?#% \t") {
			return fmt.Errorf("opsweb: Config.%s %q is not an absolute, clean path without a trailing slash (such as /ops)", p.name, p.value)
		}
	}
	if !validRunbookURL(c.RunbookURL) {
		return fmt.Errorf("opsweb: Config.RunbookURL %q is neither an absolute http(s) URL nor a path on this server, without a fragment", c.RunbookURL)
	}
	if c.BasePath == c.APIPath {
		return fmt.Errorf("opsweb: Config.BasePath and APIPath are both %q", c.BasePath)
	}
	for i, name := range c.ReconcileSources {
		if name == "" {
			return errors.New("opsweb: Config.ReconcileSources names an empty source")
		}
		if slices.Contains(c.ReconcileSources[:i], name) {
			return fmt.Errorf("opsweb: Config.ReconcileSources names %q twice", name)
		}
	}
	return nil
}

// validRunbookURL reports whether s is an absolute http(s) URL, or a path on
// this server, without a fragment: what a section's anchor can follow.
func validRunbookURL(s string) bool {
	u, err := url.Parse(s)
	if err != nil || strings.Contains(s, "#") {
		return false
	}
	switch u.Scheme {
	case "http", "https":
		return u.Host != ""
	case "":
		return u.Host == "" && strings.HasPrefix(u.Path, "/") && !strings.HasPrefix(s, "//")
	}
	return false
}

// handler serves the pages and the JSON API.
type handler struct {
	e   engine.Operator
	cfg Config
	// protected is the router behind the cross-origin protection.
	protected http.Handler
	pages     *template.Template
}

// New returns the operators' handler of e, an *engine.Engine or an
// *engine.Admin (a process with none of the service's definitions, whose
// retries, cancels and resolves a live process of the service carries out):
// the pages under cfg.BasePath and the JSON API under cfg.APIPath (see the
// package documentation). cfg is required, for its AuthFunc.
func New(e engine.Operator, cfg *Config) (http.Handler, error) {
	if e == nil || reflect.ValueOf(e).IsNil() {
		return nil, errors.New("opsweb: an engine is required")
	}
	if cfg == nil {
		return nil, errors.New("opsweb: Config.AuthFunc is required")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	pages, err := parsePages(c.BasePath, c.RunbookURL)
	if err != nil {
		return nil, err
	}
	h := &handler{e: e, cfg: c, pages: pages}
	mux, err := h.routes()
	if err != nil {
		return nil, err
	}
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuseBody(w)
		h.fail(w, r, http.StatusForbidden, "cross_origin_request",
			"a request from another site may not change anything here: use this server's own pages", "")
	}))
	h.protected = cop.Handler(mux)
	return h, nil
}

// routes registers the handler's paths, and reports as an error the panic of
// a ServeMux whose patterns conflict (paths of Config that overlap).
func (h *handler) routes() (mux *http.ServeMux, err error) {
	defer func() {
		if v := recover(); v != nil {
			mux, err = nil, fmt.Errorf("opsweb: Config.BasePath %q and APIPath %q overlap: %v", h.cfg.BasePath, h.cfg.APIPath, v)
		}
	}()
	mux = http.NewServeMux()
	b, a := h.cfg.BasePath, h.cfg.APIPath
	mux.HandleFunc("GET "+b, h.listPage)
	mux.HandleFunc("GET "+b+"/{$}", h.listPage)
	mux.HandleFunc("GET "+b+"/operations/{id}", h.operationPage)
	mux.HandleFunc("POST "+b+"/operations/{id}/retry", h.actionPage(actionRetry))
	mux.HandleFunc("POST "+b+"/operations/{id}/cancel", h.actionPage(actionCancel))
	mux.HandleFunc("GET "+a+"/operations", h.listAPI)
	mux.HandleFunc("GET "+a+"/operations/{id}", h.operationAPI)
	mux.HandleFunc("POST "+a+"/operations/{id}/retry", h.actionAPI(actionRetry))
	mux.HandleFunc("POST "+a+"/operations/{id}/cancel", h.actionAPI(actionCancel))
	mux.HandleFunc("POST "+b+"/operations/{id}/resolve", h.actionPage(actionResolve))
	mux.HandleFunc("POST "+a+"/operations/{id}/resolve", h.actionAPI(actionResolve))
	mux.HandleFunc("GET "+b+"/approvals", h.approvalsPageGet)
	mux.HandleFunc("POST "+b+"/operations/{id}/approve", h.actionPage(actionApprove))
	mux.HandleFunc("POST "+b+"/operations/{id}/reject", h.actionPage(actionReject))
	mux.HandleFunc("GET "+a+"/approvals", h.approvalsAPI)
	mux.HandleFunc("POST "+a+"/operations/{id}/approve", h.actionAPI(actionApprove))
	mux.HandleFunc("POST "+a+"/operations/{id}/reject", h.actionAPI(actionReject))
	// Not {APIPath}/reconciliation: a service may serve its own there (the
	// demo does).
	mux.HandleFunc("GET "+b+"/reconciliation", h.reconciliationPage)
	mux.HandleFunc("POST "+b+"/reconciliation/run", h.reconcilePage)
	mux.HandleFunc("GET "+a+"/mismatches", h.mismatchesAPI)
	// Patterns without a method catch the other methods: 405, not 404.
	for _, p := range []string{
		b, b + "/{$}", b + "/operations/{id}", b + "/operations/{id}/retry", b + "/operations/{id}/cancel", b + "/operations/{id}/resolve",
		b + "/reconciliation", b + "/reconciliation/run",
		b + "/approvals", b + "/operations/{id}/approve", b + "/operations/{id}/reject",
		a + "/operations", a + "/operations/{id}", a + "/operations/{id}/retry", a + "/operations/{id}/cancel", a + "/operations/{id}/resolve",
		a + "/mismatches", a + "/approvals", a + "/operations/{id}/approve", a + "/operations/{id}/reject",
	} {
		mux.HandleFunc(p, h.methodNotAllowed)
	}
	mux.HandleFunc("/", h.notFound)
	return mux, nil
}

// ServeHTTP authenticates the request, then routes it.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.cfg.AuthFunc(r); err != nil {
		refuseBody(w)
		if !h.isAPI(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="idemflow operations", charset="UTF-8"`)
		}
		h.fail(w, r, http.StatusUnauthorized, "unauthenticated", "the operators' pages need an operator's credentials", "")
		return
	}
	h.protected.ServeHTTP(w, r)
}

// isAPI reports whether r is for the JSON API rather than the pages.
func (h *handler) isAPI(r *http.Request) bool {
	p := r.URL.Path
	return p == h.cfg.APIPath || strings.HasPrefix(p, h.cfg.APIPath+"/")
}

func (h *handler) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	refuseBody(w)
	h.fail(w, r, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here", "")
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	refuseBody(w)
	h.fail(w, r, http.StatusNotFound, "not_found", "no such page", "")
}

// refuseBody closes the connection after an answer that does not read the
// request's body, so that the server does not wait for it.
func refuseBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
}

// fail answers an error: JSON for the API and for clients that do not accept
// HTML, an HTML page for a browser on the pages.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, code, message, param string) {
	if !h.isAPI(r) && acceptsHTML(r) {
		h.render(w, r, status, "error", &errorPage{Status: status, StatusText: http.StatusText(status), Code: code, Message: message, Param: param})
		return
	}
	type errorBody struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Param   string `json:"param,omitempty"`
	}
	writeJSON(w, status, map[string]errorBody{"error": {Code: code, Message: message, Param: param}})
}

// acceptsHTML reports whether the request's Accept header names text/html, as
// a browser's navigation does.
func acceptsHTML(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			media, _, _ := strings.Cut(part, ";")
			if m := strings.ToLower(strings.TrimSpace(media)); m == "text/html" || m == "application/xhtml+xml" {
				return true
			}
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"code":"internal_error","message":"could not encode the answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// ErrUnauthenticated is the error of TokenAuth's function for a request
// without the token.
var ErrUnauthenticated = errors.New("opsweb: missing or wrong credentials")

// TokenAuth returns an AuthFunc that accepts a request carrying token as the
// password of HTTP Basic authentication, with any user name (what a browser
// asks for), or as a bearer token (Authorization: Bearer <token>), compared in
// constant time; anything else gets ErrUnauthenticated, a request with more
// than one Authorization header included (which one counts would be anybody's
// guess). An empty token accepts nothing.
func TokenAuth(token string) func(r *http.Request) error {
	want := sha256.Sum256([]byte(token))
	return func(r *http.Request) error {
		values := r.Header.Values("Authorization")
		if token == "" || len(values) != 1 {
			return ErrUnauthenticated
		}
		got, ok := bearer.Token(values[0])
		if !ok {
			if _, password, basic := r.BasicAuth(); basic {
				got, ok = password, true
			}
		}
		sum := sha256.Sum256([]byte(got))
		// Equal-length digests: as long whatever the credentials.
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			return ErrUnauthenticated
		}
		return nil
	}
}
