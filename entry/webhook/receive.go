package webhook

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/idempotency"
)

// signing is how an endpoint checks signatures: the fields of Config and of
// OutcomeConfig that configure it, validated and defaulted alike.
type signing struct {
	secrets     [][]byte
	secretsFunc func(ctx context.Context) ([][]byte, error)
	verifier    Verifier
	header      string
	tolerance   time.Duration
}

func (s signing) validate() error {
	switch {
	case s.verifier != nil && (s.header != "" || s.tolerance != 0):
		return errors.New("header and tolerance configure the built-in verifier; set them on your Verifier")
	case s.secrets != nil && s.secretsFunc != nil:
		return errors.New("secrets and a secrets function are exclusive")
	case s.verifier == nil && s.secretsFunc == nil && len(s.secrets) == 0:
		return errors.New("secrets are required")
	case slices.ContainsFunc(s.secrets, func(b []byte) bool { return len(b) == 0 }):
		return errors.New("a secret is empty")
	case s.tolerance < 0:
		return errors.New("tolerance must not be negative")
	}
	return nil
}

// withDefaults returns s with its own copy of the secrets, and the built-in
// verifier unless s has one.
func (s signing) withDefaults() signing {
	s.secrets = slices.Clone(s.secrets)
	for i, b := range s.secrets {
		s.secrets[i] = slices.Clone(b)
	}
	if s.verifier == nil {
		s.verifier = SignatureVerifier{Header: s.header, Tolerance: s.tolerance}
	}
	return s
}

// receiver reads a delivery and checks its signature: what every endpoint of
// the package does before anything in a body is believed.
type receiver struct {
	// sign is defaulted (withDefaults).
	sign       signing
	maxBody    int64
	retryAfter time.Duration
	now        func() time.Time
}

// receive reads r's body, at most maxBody of it, and checks its signature.
// When it cannot, or the signature is not valid, it answers (413, 400, or 503
// when the secrets cannot be had) and returns false.
func (rc *receiver) receive(w http.ResponseWriter, r *http.Request, log *slog.Logger) ([]byte, bool) {
	ctx := r.Context()
	body, ok := rc.readBody(w, r)
	if !ok {
		return nil, false
	}
	secrets := rc.sign.secrets
	if rc.sign.secretsFunc != nil {
		var err error
		if secrets, err = rc.sign.secretsFunc(ctx); err != nil {
			log.ErrorContext(ctx, "the webhook secrets could not be read", slog.Any("error", err))
			rc.unavailable(w, idempotency.CodeServiceUnavailable, "the webhook secrets are not available; deliver the event again")
			return nil, false
		}
	}
	if err := rc.sign.verifier.Verify(r, body, secrets, rc.now()); err != nil {
		if errors.Is(err, ErrNoSecrets) {
			log.ErrorContext(ctx, "no webhook secret to check a signature with", slog.Any("error", err))
			rc.unavailable(w, idempotency.CodeServiceUnavailable, "the webhook secrets are not available; deliver the event again")
			return nil, false
		}
		log.DebugContext(ctx, "refused a webhook signature", slog.Any("error", err))
		idempotency.WriteError(w, http.StatusBadRequest, CodeInvalidSignature, err.Error(), nil)
		return nil, false
	}
	return body, true
}

// readBody reads the body, at most maxBody of it. When it cannot, it answers
// and returns false.
func (rc *receiver) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := rc.maxBody
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
func (rc *receiver) unavailable(w http.ResponseWriter, code, message string) {
	secs := max(1, int64((rc.retryAfter+time.Second-1)/time.Second))
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	idempotency.WriteError(w, http.StatusServiceUnavailable, code, message, nil)
}

// The bodies of the 200 answers.
var (
	bodyReceived  = []byte(`{"received":true}`)
	bodyDuplicate = []byte(`{"received":true,"duplicate":true}`)
	bodyIgnored   = []byte(`{"received":true,"ignored":true}`)
)

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the provider has gone: it delivers again
}
