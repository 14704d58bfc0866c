package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// TestConfig holds the knobs of Config and OutcomeConfig for tests.
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
// It returns an error when e, op or cfg is nil, when cfg is invalid, and when
// op was not given to e.
func Handler[In, S, Out any](e *engine.Engine, op *engine.Operation[In, S, Out], cfg *Config[In]) (http.Handler, error) {
	switch {
	case e == nil:
		return nil, errors.New("webhook: an engine is required")
	case op == nil:
		return nil, errors.New("webhook: an operation type is required")
	case cfg == nil:
		return nil, errors.New("webhook: a config is required")
	case !e.Registered(op):
		return nil, fmt.Errorf("webhook: operation type not registered: %q", op.Name())
	}
	c := *cfg
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("webhook: endpoint of %q: %w", op.Name(), err)
	}
	c = c.withDefaults()
	rc := receiver{sign: c.signing().withDefaults(), maxBody: c.MaxBodyBytes, retryAfter: c.RetryAfter, now: c.Test.NowFunc}
	return &endpoint[In, S, Out]{e: e, op: op, cfg: c, rc: rc}, nil
}

func (c Config[In]) validate() error {
	switch {
	case c.Scope == "":
		return errors.New("a scope is required")
	case checkID(c.Scope) != nil:
		return errors.New("the scope has a control character or is not UTF-8")
	case c.MaxBodyBytes < 0, c.Wait < 0, c.ReserveTimeout < 0, c.RetryAfter < 0:
		return errors.New("max body bytes, wait, reserve timeout and retry after must not be negative")
	}
	return c.signing().validate()
}

// signing returns the fields of c that configure the checking of signatures.
func (c Config[In]) signing() signing {
	return signing{secrets: c.Secrets, secretsFunc: c.SecretsFunc, verifier: c.Verifier, header: c.Header, tolerance: c.Tolerance}
}

func (c Config[In]) withDefaults() Config[In] {
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
	rc  receiver
}

func (ep *endpoint[In, S, Out]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := ep.cfg.Logger.With(slog.String("operation", ep.op.Name()), slog.String("scope", ep.cfg.Scope))

	// The signature, before anything in the body is believed.
	body, ok := ep.rc.receive(w, r, log)
	if !ok {
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
	var reused *engine.ReusedError
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
			slog.String("operation_id", reused.Operation.String()), slog.Any("fields", reused.Fields))
		w.Header().Set(idempotency.HeaderOperationID, reused.Operation.String())
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
