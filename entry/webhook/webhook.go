package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

// The defaults of Config.
const (
	DefaultMaxBodyBytes   = 1 << 20
	DefaultRetryAfter     = time.Second
	DefaultReserveTimeout = 8 * time.Second
)

// The error codes this package answers with besides idempotency's
// (idempotency.CodeRequestTooLarge, CodeKeyReused, CodeServiceUnavailable,
// CodeOverloaded, CodeInternalError).
const (
	// CodeInvalidSignature: the signature is missing, malformed, outside the
	// tolerance or matches no secret. 400; nothing is recorded.
	CodeInvalidSignature = "invalid_signature"
	// CodeInvalidEvent: the body is signed but no event can be read from it
	// (Config.EventFunc failed, or its id is not a key). 400; nothing is
	// recorded.
	CodeInvalidEvent = "invalid_event"
)

// Config configures a webhook endpoint. Handler copies it, so changing it later
// does not change the endpoint.
type Config[In any] struct {
	// Scope is the engine scope of the events' keys (see engine.Start), such
	// as "webhook:stripe": one per provider, since event ids of two providers
	// may meet, and one that no client of the service's other endpoints has,
	// since keys of one scope meet whatever the operation type. Required.
	Scope string
	// Secrets are the secrets signatures are checked with, all at once: during
	// a rotation, the old and the new one. Required with the built-in verifier,
	// unless SecretsFunc is set. Handler copies them.
	Secrets [][]byte
	// SecretsFunc, when set instead of Secrets, returns the current secrets on
	// every request, for secrets that rotate without a restart. An error answers
	// 503 service_unavailable with Retry-After (the provider retries) and is
	// logged.
	SecretsFunc func(ctx context.Context) ([][]byte, error)
	// Verifier checks the signature. Defaults to SignatureVerifier{Header,
	// Tolerance}, Stripe's scheme.
	Verifier Verifier
	// Header and Tolerance configure the built-in verifier (see
	// SignatureVerifier): they default to DefaultHeader ("Provider-Signature")
	// and DefaultTolerance (5 minutes). Handler refuses them beside a Verifier,
	// which has its own.
	Header    string
	Tolerance time.Duration
	// EventFunc reads the event from a request whose signature is valid: its
	// id, the operation's key, and the operation's input. It must depend on
	// the request alone, so that every delivery of an event gives the same
	// input. An error answers 400 invalid_event with the error's text as
	// message, ErrIgnore 200 ignored; neither records anything. Defaults to
	// ParseEvent for the event, and the body decoded with encoding/json for the
	// input (members In lacks are dropped, and take no part in the
	// fingerprint).
	EventFunc func(r *http.Request, body []byte) (Event, In, error)
	// MaxBodyBytes bounds the body: a larger one answers 413
	// request_too_large. Defaults to 1 MiB.
	MaxBodyBytes int64
	// Wait is how long a first delivery waits for its operation to finish
	// before it answers; the answer is 200 whatever the outcome. Defaults to
	// zero: the answer goes once the operation's key is reserved, which commits
	// with its first database step.
	Wait time.Duration
	// ReserveTimeout bounds the wait for the reservation of the event's key: a
	// database that does not answer by then gets a 503 with Retry-After. Defaults
	// to 8 seconds.
	ReserveTimeout time.Duration
	// RetryAfter is what the Retry-After header of a 503 says, rounded up to
	// whole seconds, at least 1. Defaults to 1 second.
	RetryAfter time.Duration
	// Logger receives the faults the endpoint answers 5xx for, and (at debug
	// level) the refused signatures. Defaults to slog.Default().
	Logger *slog.Logger
	// Test holds knobs for tests, which production code leaves zero.
	Test TestConfig
}

// TestConfig holds the knobs of Config for tests.
type TestConfig struct {
	// NowFunc is the clock that signatures' timestamps are checked against.
	// Defaults to time.Now.
	NowFunc func() time.Time
}

// Handler returns the http.Handler of a webhook endpoint that starts an
// operation of type op for each event, keyed by the event's id, exactly once
// however often the provider delivers it. See the package documentation for
// what it answers when. It serves whatever method and path it is mounted on.
//
// It returns an error when cfg is nil or invalid, or op is not registered with e.
func Handler[In, S, Out any](e *engine.Engine, op *engine.Operation[In, S, Out], cfg *Config[In]) (http.Handler, error) {
	switch {
	case e == nil:
		return nil, errors.New("webhook: an engine is required")
	case op == nil:
		return nil, errors.New("webhook: an operation type is required")
	case cfg == nil:
		return nil, errors.New("webhook: a config is required")
	case !e.Registered(op):
		return nil, fmt.Errorf("webhook: %w: %q", engine.ErrNotRegistered, op.Name())
	}
	c := *cfg
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("webhook: endpoint of %q: %w", op.Name(), err)
	}
	c = c.withDefaults()
	return &endpoint[In, S, Out]{e: e, op: op, cfg: c}, nil
}

func (c Config[In]) validate() error {
	switch {
	case c.Scope == "":
		return errors.New("a scope is required")
	case checkID(c.Scope) != nil:
		return errors.New("the scope has a control character or is not UTF-8")
	case c.Verifier != nil && (c.Header != "" || c.Tolerance != 0):
		return errors.New("header and tolerance configure the built-in verifier; set them on your Verifier")
	case c.Secrets != nil && c.SecretsFunc != nil:
		return errors.New("secrets and a secrets function are exclusive")
	case c.Verifier == nil && c.SecretsFunc == nil && len(c.Secrets) == 0:
		return errors.New("secrets are required")
	case slices.ContainsFunc(c.Secrets, func(s []byte) bool { return len(s) == 0 }):
		return errors.New("a secret is empty")
	case c.Tolerance < 0, c.MaxBodyBytes < 0, c.Wait < 0, c.ReserveTimeout < 0, c.RetryAfter < 0:
		return errors.New("tolerance, max body bytes, wait, reserve timeout and retry after must not be negative")
	}
	return nil
}

func (c Config[In]) withDefaults() Config[In] {
	c.Secrets = slices.Clone(c.Secrets)
	for i, s := range c.Secrets {
		c.Secrets[i] = slices.Clone(s)
	}
	if c.Verifier == nil {
		c.Verifier = SignatureVerifier{Header: c.Header, Tolerance: c.Tolerance}
	}
	if c.EventFunc == nil {
		c.EventFunc = decodeEvent[In]
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.ReserveTimeout == 0 {
		c.ReserveTimeout = DefaultReserveTimeout
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Test.NowFunc == nil {
		c.Test.NowFunc = time.Now
	}
	return c
}

// decodeEvent is the default EventFunc.
func decodeEvent[In any](_ *http.Request, body []byte) (Event, In, error) {
	var in In
	ev, err := ParseEvent(body)
	if err != nil {
		return ev, in, err
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return ev, in, decodeError(err)
	}
	return ev, in, nil
}

type endpoint[In, S, Out any] struct {
	e   *engine.Engine
	op  *engine.Operation[In, S, Out]
	cfg Config[In]
}

// The bodies of the 200 answers.
var (
	bodyReceived  = []byte(`{"received":true}`)
	bodyDuplicate = []byte(`{"received":true,"duplicate":true}`)
	bodyIgnored   = []byte(`{"received":true,"ignored":true}`)
)

func (ep *endpoint[In, S, Out]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := ep.cfg.Logger.With(slog.String("operation", ep.op.Name()), slog.String("scope", ep.cfg.Scope))

	body, ok := ep.readBody(w, r)
	if !ok {
		return
	}

	// The signature, before anything in the body is believed.
	secrets := ep.cfg.Secrets
	if ep.cfg.SecretsFunc != nil {
		var err error
		if secrets, err = ep.cfg.SecretsFunc(ctx); err != nil {
			log.ErrorContext(ctx, "the webhook secrets could not be read", slog.Any("error", err))
			ep.unavailable(w, idempotency.CodeServiceUnavailable, "the webhook secrets are not available; deliver the event again")
			return
		}
	}
	if err := ep.cfg.Verifier.Verify(r, body, secrets, ep.cfg.Test.NowFunc()); err != nil {
		if errors.Is(err, ErrNoSecrets) {
			log.ErrorContext(ctx, "no webhook secret to check a signature with", slog.Any("error", err))
			ep.unavailable(w, idempotency.CodeServiceUnavailable, "the webhook secrets are not available; deliver the event again")
			return
		}
		log.DebugContext(ctx, "refused a webhook signature", slog.Any("error", err))
		idempotency.WriteError(w, http.StatusBadRequest, CodeInvalidSignature, err.Error(), nil)
		return
	}

	ev, in, err := ep.cfg.EventFunc(r, body)
	if errors.Is(err, ErrIgnore) {
		writeJSON(w, http.StatusOK, bodyIgnored)
		return
	}
	if err == nil {
		err = checkID(ev.ID)
	}
	if err != nil {
		idempotency.WriteError(w, http.StatusBadRequest, CodeInvalidEvent, err.Error(), nil)
		return
	}
	log = log.With(slog.String("key", ev.ID), slog.String("event_type", ev.Type))

	// No read first: the reservation finds a taken key, and only then does the
	// engine read the operation that holds it.
	rctx, cancel := context.WithTimeout(ctx, ep.cfg.ReserveTimeout)
	started, err := engine.Start(rctx, ep.e, ep.op, ep.cfg.Scope, ev.ID, in, nil)
	cancel()
	var reused *engine.KeyReusedError
	switch {
	case ctx.Err() != nil:
		return // the provider has gone; it delivers again
	case engine.IsUnavailable(err):
		log.WarnContext(ctx, "the database did not answer the reservation", slog.Any("error", err))
		idempotency.WriteStartError(w, err, ep.cfg.RetryAfter, "deliver the event again")
		return
	case idempotency.WriteStartError(w, err, ep.cfg.RetryAfter, "deliver the event again"):
		return
	case errors.As(err, &reused):
		// Providers never do this; whatever it is, the event does not run twice.
		log.WarnContext(ctx, "an event id came again with another event",
			slog.String("operation_id", reused.ID.String()), slog.Any("fields", reused.Fields))
		w.Header().Set(idempotency.HeaderOperationID, reused.ID.String())
		idempotency.WriteError(w, http.StatusUnprocessableEntity, idempotency.CodeKeyReused,
			"this event id was delivered before with a different event",
			map[string]any{"mismatchedFields": reused.Fields})
		return
	case err != nil:
		log.ErrorContext(ctx, "could not start the event's operation", slog.Any("error", err))
		idempotency.WriteError(w, http.StatusInternalServerError, idempotency.CodeInternalError,
			"an internal error occurred; deliver the event again", nil)
		return
	}
	w.Header().Set(idempotency.HeaderOperationID, started.ID.String())
	if !started.Created {
		writeJSON(w, http.StatusOK, bodyDuplicate)
		return
	}
	if ep.cfg.Wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, ep.cfg.Wait)
		_, err := started.Wait(wctx)
		cancel()
		if ctx.Err() != nil {
			return // the provider has gone; a delivery again is a duplicate
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			log.WarnContext(ctx, "waiting for the event's operation failed",
				slog.String("operation_id", started.ID.String()), slog.Any("error", err))
		}
	}
	writeJSON(w, http.StatusOK, bodyReceived)
}

// readBody reads the body, at most MaxBodyBytes of it. When it cannot, it
// answers and returns false.
func (ep *endpoint[In, S, Out]) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := ep.cfg.MaxBodyBytes
	tooLarge := func() ([]byte, bool) {
		// The rest of the body is not read: the connection closes.
		w.Header().Set("Connection", "close")
		idempotency.WriteError(w, http.StatusRequestEntityTooLarge, idempotency.CodeRequestTooLarge,
			"the body is larger than "+strconv.FormatInt(limit, 10)+" bytes", nil)
		return nil, false
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		// The sender stalled past the server's read deadline: no answer, the
		// connection is closed.
		panic(http.ErrAbortHandler)
	case err != nil:
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, "the body could not be read", nil)
		return nil, false
	case int64(len(body)) > limit:
		return tooLarge()
	}
	return body, true
}

// unavailable answers 503 with Retry-After: nothing was recorded, and the
// provider's next delivery runs the event.
func (ep *endpoint[In, S, Out]) unavailable(w http.ResponseWriter, code, message string) {
	secs := max(1, int64((ep.cfg.RetryAfter+time.Second-1)/time.Second))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	idempotency.WriteError(w, http.StatusServiceUnavailable, code, message, nil)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the provider has gone: it delivers again
}
