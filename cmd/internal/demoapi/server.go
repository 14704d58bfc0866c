package demoapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/internal/bearer"
	"github.com/idemflow/idemflow/opsweb"
	"github.com/idemflow/idemflow/workflows/refund"
)

// Config is what the demo's HTTP API is made of.
type Config struct {
	// Pool is the database of the reads (orders, refunds, accounts).
	Pool *pgxpool.Pool
	// Engine runs the operations; /healthz asks its Health, which reads on
	// its control pool, so that a main pool busy with requests (rows
	// locked, say) does not read as a database that is down.
	Engine    *engine.Engine
	Workflows *refund.Workflows
	// Clients are the API's clients and their bearer tokens.
	Clients []Client
	// Wait is how long a keyed request waits for its operation before 202.
	Wait time.Duration
	// Provider, when not nil, is the fake provider, mounted under /provider.
	Provider http.Handler
	// EntryPoints, when not nil, serves the ways in beyond the clients' keyed
	// requests: the provider's webhooks, the queue, settlements.
	EntryPoints *EntryPoints
	// Metrics, when not nil, serves GET /metrics, without authentication.
	Metrics http.Handler
	// ObserveRequest, when not nil, is told how each keyed request was
	// answered (idempotency.Config.ObserveFunc).
	ObserveRequest func(ctx context.Context, operation string, outcome idempotency.Outcome)
	// AdminToken, when not empty, is the operators' secret: it serves the
	// operators' pages (opsweb) at /ops and their JSON API under /admin, and
	// RiverUI under /riverui/, to requests that carry it as HTTP Basic
	// authentication's password (any user name) or as a bearer token. No
	// client's token may be it.
	AdminToken string
	// RiverUI, when not nil (and AdminToken set), is River UI's handler, with
	// the prefix /riverui, served behind the admin token.
	RiverUI http.Handler
	Logger  *slog.Logger
}

// Client is an API client and its bearer token.
type Client struct {
	Name  string
	Token string
}

// server routes the demo's API.
type server struct {
	cfg *Config
	mux *http.ServeMux
	// digests are the SHA-256 of the clients' tokens, in cfg.Clients' order.
	digests [][sha256.Size]byte
	// ops is the operators' pages and JSON API (opsweb), when AdminToken is
	// set.
	ops http.Handler
}

type clientKey struct{}

// New returns the demo's HTTP API: the handler that cmd/demo serves, and that
// cmd/bench's http mode measures.
func New(cfg *Config) (http.Handler, error) {
	s := &server{cfg: cfg, mux: http.NewServeMux()}
	for _, c := range cfg.Clients {
		s.digests = append(s.digests, sha256.Sum256([]byte(c.Token)))
	}
	idem := &idempotency.Config{
		Engine:      cfg.Engine,
		ScopeFunc:   func(r *http.Request) (string, error) { return clientOf(r), nil },
		Wait:        cfg.Wait,
		Logger:      cfg.Logger,
		ObserveFunc: cfg.ObserveRequest,
	}
	orders, err := idempotency.Handler(idem, cfg.Workflows.Order, &idempotency.EndpointOpts[refund.OrderInput]{
		DecodeFunc:      decodeOrder,
		Unfingerprinted: []string{"metadata"},
		ErrorStatusFunc: errorStatus,
	})
	if err != nil {
		return nil, err
	}
	refunds, err := idempotency.Handler(idem, cfg.Workflows.Refund, &idempotency.EndpointOpts[refund.RefundInput]{
		DecodeFunc:      decodeRefund,
		Unfingerprinted: []string{"metadata"},
		ErrorStatusFunc: errorStatus,
	})
	if err != nil {
		return nil, err
	}
	// The client's own operations, and those of its queued messages.
	operation, err := idempotency.OperationHandler(idem, &idempotency.OperationOpts{OwnsFunc: ownsScope})
	if err != nil {
		return nil, err
	}

	if cfg.AdminToken != "" {
		if err := s.operators(); err != nil {
			return nil, err
		}
	}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Provider != nil {
		s.mux.Handle("/provider/", http.StripPrefix("/provider", cfg.Provider))
	}
	s.mux.Handle("POST /orders", s.authenticated(orders))
	s.mux.Handle("GET /orders/{orderId}", s.authenticated(bounded(s.getOrder)))
	s.mux.Handle("POST /refunds", s.authenticated(refunds))
	s.mux.Handle("GET /refunds/{refundId}", s.authenticated(bounded(s.getRefund)))
	s.mux.Handle("GET /accounts", s.authenticated(bounded(s.listAccounts)))
	s.mux.Handle("GET /operations/{operationId}", s.authenticated(bounded(operation.ServeHTTP)))
	if cfg.EntryPoints != nil {
		if err := s.entryPoints(); err != nil {
			return nil, err
		}
	}
	// Patterns without a method catch the other methods, so that even a 405 is
	// a JSON error.
	for _, path := range []string{"/healthz", "/orders", "/orders/{orderId}", "/refunds", "/refunds/{refundId}", "/accounts", "/operations/{operationId}"} {
		s.mux.HandleFunc(path, methodNotAllowed)
	}
	s.mux.HandleFunc("/", notFound)
	return s, nil
}

// ServeHTTP implements http.Handler. Headers over 64 KiB answer 431 (those
// that net/http itself refuses, a few KiB larger, get its 431 as JSON too: see
// JSONErrors), and
// a path that is not clean ("//refunds", "/orders/..") answers 404 rather than
// the router's redirect: every answer is JSON.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if headerBytes(r) > maxHeaderBytes {
		idempotency.RefuseBody(w)
		idempotency.WriteError(w, http.StatusRequestHeaderFieldsTooLarge, "request_headers_too_large",
			fmt.Sprintf("the request's headers are larger than %d bytes", maxHeaderBytes), nil)
		return
	}
	if p := r.URL.Path; p != "*" && (p == "" || path.Clean(p) != p && path.Clean(p)+"/" != p) || strings.Contains(r.URL.Path, "//") {
		notFound(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// headerBytes counts a request's header bytes as they were sent, near enough.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4
	for name, values := range r.Header {
		for _, v := range values {
			n += len(name) + len(v) + 4
		}
	}
	return n
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	idempotency.RefuseBody(w) // the body, if any, is not read
	idempotency.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here", nil)
}

func notFound(w http.ResponseWriter, _ *http.Request) {
	idempotency.RefuseBody(w) // the body, if any, is not read
	idempotency.WriteError(w, http.StatusNotFound, "not_found", "no such endpoint", nil)
}

// operators mounts the operators' pages at /ops, their JSON API under /admin
// (with the demo's approvals, see approvals) and River UI under /riverui/,
// each behind the admin token.
func (s *server) operators() error {
	for _, c := range s.cfg.Clients {
		if c.Token == s.cfg.AdminToken {
			return fmt.Errorf("demoapi: client %s's token is the admin token: a client's token must not be enough for /ops", c.Name)
		}
	}
	auth := opsweb.TokenAuth(s.cfg.AdminToken)
	ops, err := opsweb.New(s.cfg.Engine, &opsweb.Config{
		AuthFunc: auth, BasePath: "/ops", APIPath: "/admin", ReadTimeout: readTimeout, Logger: s.cfg.Logger,
		ReferenceField: "providerRefundId", ReconcileSources: []string{refund.ProviderSource},
	})
	if err != nil {
		return err
	}
	s.ops = ops
	s.mux.Handle("/ops", ops)
	s.mux.Handle("/ops/", ops)
	s.mux.Handle("/admin/", ops)
	s.approvals()
	if s.cfg.RiverUI != nil {
		// River UI's own API changes jobs (retry, cancel, delete): the same
		// protection against other sites' forms as the pages'.
		riverUI := sameOrigin(s.cfg.RiverUI)
		s.mux.Handle("/riverui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if auth(r) != nil {
				idempotency.RefuseBody(w)
				w.Header().Set("WWW-Authenticate", `Basic realm="idemflow operations", charset="UTF-8"`)
				idempotency.WriteError(w, http.StatusUnauthorized, "unauthenticated", "River UI needs the admin token", nil)
				return
			}
			riverUI.ServeHTTP(w, r)
		}))
	}
	return nil
}

// authenticated answers 401 unless the request carries a known client's bearer
// token, and passes the client's name on in the request's context. A request with
// more than one Authorization header is refused: which of them counts would be
// anybody's guess (a proxy may read the last where this server reads the first).
// A 401 does not read the body: the connection closes after it.
func (s *server) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(message string) {
			idempotency.RefuseBody(w)
			idempotency.WriteError(w, http.StatusUnauthorized, "unauthenticated", message, nil)
		}
		values := r.Header.Values("Authorization")
		if len(values) > 1 {
			refuse("more than one Authorization header")
			return
		}
		name := ""
		if token, ok := bearer.Token(strings.Join(values, "")); ok {
			sum := sha256.Sum256([]byte(token))
			for i, c := range s.cfg.Clients {
				// Equal-length digests: the comparison takes as long whatever
				// the token, and every client is compared.
				if subtle.ConstantTimeCompare(sum[:], s.digests[i][:]) == 1 {
					name = c.Name
				}
			}
		}
		if name == "" {
			refuse("missing or unknown bearer token")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientKey{}, name)))
	})
}

func clientOf(r *http.Request) string {
	name, _ := r.Context().Value(clientKey{}).(string)
	return name
}

// healthz answers 200 while the engine can serve (Engine.Health: the database
// answers within 2 seconds, and its schema is one this build's statements
// fit), 503 otherwise: a process of an older build left running after a newer
// one migrated the database with a migration that is not rolling reads as
// unhealthy, not as one that answers 500s.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.Engine.Health(ctx); err != nil {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// bounded bounds the database reads of a GET endpoint: a database that does
// not answer gets a 503 within readTimeout.
func bounded(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		next(w, r.WithContext(ctx))
	})
}

func (s *server) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("orderId")
	if !possibleID(id) {
		idempotency.WriteError(w, http.StatusNotFound, refund.CodeOrderNotFound, "no such order", nil)
		return
	}
	order, err := refund.GetOrder(r.Context(), s.cfg.Pool, clientOf(r), id)
	if errors.Is(err, refund.ErrOrderNotFound) {
		idempotency.WriteError(w, http.StatusNotFound, refund.CodeOrderNotFound, "no such order", nil)
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, order)
}

func (s *server) getRefund(w http.ResponseWriter, r *http.Request) {
	notFound := func() {
		idempotency.WriteError(w, http.StatusNotFound, "refund_not_found", "no such refund", nil)
	}
	id := r.PathValue("refundId")
	if !possibleID(id) {
		notFound()
		return
	}
	ref, err := refund.GetRefund(r.Context(), s.cfg.Pool, clientOf(r), id)
	if errors.Is(err, refund.ErrRefundNotFound) {
		notFound()
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ref)
}

func (s *server) listAccounts(w http.ResponseWriter, r *http.Request) {
	accounts, err := refund.ListAccounts(r.Context(), s.cfg.Pool, clientOf(r))
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"accounts": accounts})
}

func (s *server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if engine.IsUnavailable(err) {
		s.cfg.Logger.WarnContext(r.Context(), "the database did not answer", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		w.Header().Set("Retry-After", "1")
		idempotency.WriteError(w, http.StatusServiceUnavailable, "service_unavailable", "the database is not available; try again", nil)
		return
	}
	s.cfg.Logger.ErrorContext(r.Context(), "request failed", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	idempotency.WriteError(w, http.StatusInternalServerError, "internal_error", "the server could not answer; try again", nil)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		idempotency.WriteError(w, http.StatusInternalServerError, "internal_error", "could not encode the answer", nil)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// errorStatus maps the workflows' business error codes to HTTP statuses.
func errorStatus(code string) int {
	switch code {
	case refund.CodeOrderNotFound:
		return http.StatusNotFound
	case refund.CodeOrderExists:
		return http.StatusConflict
	case refund.CodeAmountExceedsRefundable, refund.CodeRefundRejected, refund.CodeApprovalExpired:
		return http.StatusUnprocessableEntity
	case refund.CodeProviderDeclined, refund.CodeProviderRefundFailed:
		return http.StatusPaymentRequired
	case refund.CodeInvalidRequest:
		return http.StatusBadRequest
	}
	return 0
}

// sameOrigin refuses (403 cross_origin_request) a request that changes
// something and comes from another site, whose browser may carry the admin's
// Basic credentials (Go's http.CrossOriginProtection).
func sameOrigin(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		idempotency.RefuseBody(w)
		idempotency.WriteError(w, http.StatusForbidden, "cross_origin_request", "a request from another site may not change anything here", nil)
	}))
	return cop.Handler(next)
}
