package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
)

// DefaultRecordTimeout is the default of OutcomeConfig.RecordTimeout.
const DefaultRecordTimeout = 8 * time.Second

// OutcomeConfig configures an endpoint that records the provider's word on
// the calls the service made (see Outcomes). Outcomes copies it, so changing
// it later does not change the endpoint.
type OutcomeConfig struct {
	// OutcomeFunc reads the outcome from a request whose signature is valid:
	// EventID, the provider's id of the event (1 to MaxEventIDLen bytes of
	// text, the same on every delivery), Record.Key, the derived key of the
	// call the event is about (the idempotency key the step sent, which the
	// provider's event repeats; by the same rules), what the provider says of
	// the call (Record's Status, Reference, Amount and Data, which the step's
	// reconcile function compares with the operation's input), and, for a
	// failed call, Failure, the step's answer (engine.Fail). It must depend on
	// the request alone, so that every delivery of an event gives the same
	// outcome.
	//
	// ErrIgnore, for an event the service does not act on (a type it does not
	// handle), answers 200 {"received":true,"ignored":true}; another error
	// answers 400 invalid_event with the error's text as message. Neither
	// records anything. Required.
	OutcomeFunc func(r *http.Request, body []byte) (engine.Outcome, error)
	// TxFunc, when set, runs in the transaction that records the outcome,
	// after Engine.RecordOutcome: the application's own writes about the event
	// (its record of it, a row of its own that the event updates) commit with
	// the outcome, or neither does. added is false for an event that the inbox
	// holds already (a delivery again: what TxFunc wrote the first time has
	// committed). An error rolls both back and answers 503 service_unavailable
	// when engine.IsUnavailable says the database did not answer, 500
	// internal_error otherwise: the provider delivers the event again.
	//
	// TxFunc refuses a delivery that the inbox cannot tell from another one
	// (an event id that came before with another body, under another key, or
	// with a part the outcome does not carry) by returning an
	// *engine.ReusedError whose Fields name what differs: the endpoint
	// rolls everything back and answers 422 idempotency_key_reused with those
	// fields as error.mismatchedFields. When the inbox finds the event id
	// reused first, TxFunc is asked too (added false, in a transaction that
	// is rolled back): its own refusal's fields (the body's) are answered
	// rather than the outcome's.
	TxFunc func(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error
	// Secrets are the secrets signatures are checked with, all at once: during
	// a rotation, the old and the new one. Required with the built-in verifier,
	// unless SecretsFunc is set. Outcomes copies them.
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
	// and DefaultTolerance (5 minutes). Outcomes refuses them beside a
	// Verifier, which has its own.
	Header    string
	Tolerance time.Duration
	// MaxBodyBytes bounds the body: a larger one answers 413
	// request_too_large. Defaults to 1 MiB.
	MaxBodyBytes int64
	// RecordTimeout bounds the transaction that records an outcome, from its
	// BEGIN to its COMMIT, TxFunc included, and the tries again of a
	// transaction that a transient fault rolled back (engine.IsUnavailable: a
	// lock wait past lock_timeout, as when many deliveries of one event come at
	// once and queue on its key): a database that does not answer by then gets
	// a 503 with Retry-After. Defaults to 8 seconds.
	RecordTimeout time.Duration
	// RetryAfter is what the Retry-After header of a 503 says, rounded up to
	// whole seconds, at least 1. Defaults to 1 second.
	RetryAfter time.Duration
	// Logger receives the faults the endpoint answers 5xx for, the events
	// whose id came again with another outcome, and (at debug level) the
	// refused signatures. Defaults to slog.Default().
	Logger *slog.Logger
	// Test holds knobs for tests, which production code leaves zero.
	Test TestConfig
}

func (c OutcomeConfig) validate() error {
	switch {
	case c.OutcomeFunc == nil:
		return errors.New("an outcome function is required")
	case c.MaxBodyBytes < 0, c.RecordTimeout < 0, c.RetryAfter < 0:
		return errors.New("max body bytes, record timeout and retry after must not be negative")
	}
	return c.signing().validate()
}

// signing returns the fields of c that configure the checking of signatures.
func (c OutcomeConfig) signing() signing {
	return signing{secrets: c.Secrets, secretsFunc: c.SecretsFunc, verifier: c.Verifier, header: c.Header, tolerance: c.Tolerance}
}

func (c OutcomeConfig) withDefaults() OutcomeConfig {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.RecordTimeout == 0 {
		c.RecordTimeout = DefaultRecordTimeout
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

// Outcomes returns the http.Handler of a webhook endpoint that records what
// the provider's events say of the calls the service made: for each event,
// the outcome that cfg.OutcomeFunc reads from it goes to e's inbox
// (Engine.RecordOutcome) under the call's derived key, in a transaction on
// e's pool (Engine.Pool), with what cfg.TxFunc writes. The external step that
// made the call applies it whenever it waits, whatever its state when the
// event comes, and whichever process runs it. It answers 2xx only once the
// outcome has committed. See the package documentation, "Outcomes", for what
// it answers when. It serves whatever method and path it is mounted on.
//
// It takes no operation type: an outcome is about a call, whichever operation
// made it. It returns an error when e or cfg is nil, or cfg is invalid.
func Outcomes(e *engine.Engine, cfg *OutcomeConfig) (http.Handler, error) {
	switch {
	case e == nil:
		return nil, errors.New("webhook: an engine is required")
	case cfg == nil:
		return nil, errors.New("webhook: a config is required")
	}
	c := *cfg
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("webhook: outcomes endpoint: %w", err)
	}
	c = c.withDefaults()
	rc := receiver{sign: c.signing().withDefaults(), maxBody: c.MaxBodyBytes, retryAfter: c.RetryAfter, now: c.Test.NowFunc}
	return &outcomes{e: e, pool: e.Pool(), cfg: c, rc: rc}, nil
}

type outcomes struct {
	e    *engine.Engine
	pool *pgxpool.Pool
	cfg  OutcomeConfig
	rc   receiver
}

func (ep *outcomes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	log := ep.cfg.Logger

	// The signature, before anything in the body is believed.
	body, ok := ep.rc.receive(w, r, log)
	if !ok {
		return
	}

	o, err := ep.cfg.OutcomeFunc(r, body)
	if errors.Is(err, ErrIgnore) {
		writeJSON(w, http.StatusOK, bodyIgnored)
		return
	}
	if err == nil {
		err = checkID(o.EventID)
	}
	if err == nil {
		err = checkKey(o.Record.Key)
	}
	if err != nil {
		idempotency.WriteError(w, http.StatusBadRequest, CodeInvalidEvent, err.Error(), nil)
		return
	}
	log = log.With(slog.String("event_id", o.EventID), slog.String("key", o.Record.Key),
		slog.String("status", string(o.Record.Status.OrDefault())))

	added, err := ep.record(ctx, o)
	var down *unreachableError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return // the provider has gone; it delivers again
	case errors.As(err, new(*engine.ReusedError)):
		// Providers never do this; whatever it is, the first outcome stands.
		log.WarnContext(ctx, "an event id came again with another outcome", slog.Any("error", err))
		var extra map[string]any
		if reused := (*engine.ReusedError)(nil); errors.As(err, &reused) {
			extra = map[string]any{"mismatchedFields": reused.Fields}
		}
		idempotency.WriteError(w, http.StatusUnprocessableEntity, idempotency.CodeKeyReused,
			"this event id was delivered before with a different outcome", extra)
		return
	case errors.As(err, &down), engine.IsUnavailable(err):
		log.WarnContext(ctx, "the outcome could not be recorded", slog.Any("error", err))
		ep.rc.unavailable(w, idempotency.CodeServiceUnavailable, "the database is not available; deliver the event again")
		return
	default:
		log.ErrorContext(ctx, "the outcome could not be recorded", slog.Any("error", err))
		idempotency.WriteError(w, http.StatusInternalServerError, idempotency.CodeInternalError,
			"an internal error occurred; deliver the event again", nil)
		return
	}
	if !added {
		writeJSON(w, http.StatusOK, bodyDuplicate)
		return
	}
	writeJSON(w, http.StatusOK, bodyReceived)
}

// Retry waits of record: a transaction that a transient fault rolled back is
// tried again after minRetryWait, doubled each time up to maxRetryWait.
const (
	minRetryWait = 10 * time.Millisecond
	maxRetryWait = 200 * time.Millisecond
)

// record keeps o in the engine's inbox, with what TxFunc writes, in one
// transaction on the pool; it returns RecordOutcome's added. An error of the
// BEGIN or the COMMIT is an *unreachableError: nothing was recorded, or the
// answer was lost, and a delivery again finds out which.
//
// A fault between the two that engine.IsUnavailable calls transient (a lock
// that another delivery of the event held past lock_timeout: deliveries of one
// event at once queue on its key; a dropped connection) rolled everything
// back: the transaction is tried again, while RecordTimeout lasts.
func (ep *outcomes) record(ctx context.Context, o engine.Outcome) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, ep.cfg.RecordTimeout)
	defer cancel()
	for wait := minRetryWait; ; wait = min(2*wait, maxRetryWait) {
		added, err := ep.recordOnce(ctx, o)
		var down *unreachableError
		if err == nil || ctx.Err() != nil || errors.As(err, &down) || !engine.IsUnavailable(err) {
			return added, err
		}
		ep.cfg.Logger.DebugContext(ctx, "the outcome's transaction is tried again", slog.String("event_id", o.EventID), slog.Any("error", err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, err
		case <-t.C:
		}
	}
}

// recordOnce is one try of record.
func (ep *outcomes) recordOnce(ctx context.Context, o engine.Outcome) (bool, error) {
	tx, err := ep.pool.Begin(ctx)
	if err != nil {
		return false, &unreachableError{fmt.Errorf("webhook: begin: %w", err)}
	}
	defer func() { _ = tx.Rollback(ctx) }() // after a commit, a no-op
	added, err := ep.e.RecordOutcome(ctx, tx, o)
	if reused := (*engine.ReusedError)(nil); errors.As(err, &reused) && ep.cfg.TxFunc != nil {
		// The application knows its event better than the outcome does: a
		// refusal of its own names the fields of its body that differ. The
		// transaction is rolled back either way.
		if terr := ep.cfg.TxFunc(ctx, tx, o, false); errors.As(terr, &reused) {
			return false, reused
		}
		return false, err
	}
	if err != nil {
		return false, err
	}
	if ep.cfg.TxFunc != nil {
		if err := ep.cfg.TxFunc(ctx, tx, o, added); err != nil {
			return false, fmt.Errorf("webhook: the outcome's TxFunc: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return false, &unreachableError{fmt.Errorf("webhook: commit: %w", err)}
	}
	return added, nil
}

// unreachableError is a BEGIN or a COMMIT that failed: 503, whatever the
// cause.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }
