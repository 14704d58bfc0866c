package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The defaults of SignatureVerifier, and so of Config.
const (
	// DefaultHeader is the header that carries the signature.
	DefaultHeader = "Provider-Signature"
	// DefaultTolerance is how far a signature's timestamp may be from the
	// handler's clock, either way.
	DefaultTolerance = 5 * time.Minute
)

// The errors of SignatureVerifier. Each answers 400 invalid_signature but
// ErrNoSecrets, a configuration fault, which answers 503.
var (
	// ErrNoSignature: the request has no signature header.
	ErrNoSignature = errors.New("no signature header")
	// ErrMalformedSignature: the signature header cannot be read (sent twice,
	// no timestamp, no v1 signature, a value that is not what it must be).
	ErrMalformedSignature = errors.New("the signature header is malformed")
	// ErrTimestampOutOfTolerance: the signature's timestamp is too old, or too
	// far in the future.
	ErrTimestampOutOfTolerance = errors.New("the signature's timestamp is outside the tolerance")
	// ErrSignatureMismatch: no v1 signature of the header is the body's under
	// any of the secrets.
	ErrSignatureMismatch = errors.New("no signature matches the body")
	// ErrNoSecrets: there are no secrets to check a signature with. A Verifier
	// of your own that needs secrets may return it (wrapped) too.
	ErrNoSecrets = errors.New("no webhook secrets are configured")
)

// Verifier checks that a request comes from the provider: the way to plug in a
// provider's own signature scheme (see the package documentation, "Other
// providers").
type Verifier interface {
	// Verify returns nil when r, whose body is body (already read: r.Body is
	// empty), is signed under one of secrets (Config.Secrets or
	// Config.SecretsFunc, in their order) and, for a scheme with a timestamp,
	// recent at now (the handler's clock). Any error answers 400
	// invalid_signature with the error's text as message, so it must name no
	// secret; one that wraps ErrNoSecrets answers 503 instead, so that the
	// provider retries once the secrets are back.
	Verify(r *http.Request, body []byte, secrets [][]byte, now time.Time) error
}

// VerifierFunc is a function that is a Verifier.
type VerifierFunc func(r *http.Request, body []byte, secrets [][]byte, now time.Time) error

// Verify implements Verifier.
func (f VerifierFunc) Verify(r *http.Request, body []byte, secrets [][]byte, now time.Time) error {
	return f(r, body, secrets, now)
}

// SignatureVerifier is the built-in Verifier, for Stripe's scheme: the header
//
//	Provider-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
//
// where <t> is the timestamp exactly as the header writes it. The header may
// carry several v1 entries (a provider that rotates its secret signs with the
// old and the new one for a while); one that matches under any of the secrets
// suffices. Entries of other schemes (v0=...) are ignored. Signatures are
// compared in constant time (hmac.Equal).
type SignatureVerifier struct {
	// Header is the header that carries the signature. Defaults to
	// DefaultHeader, "Provider-Signature".
	Header string
	// Tolerance is how far the timestamp may be from now, in the past or in the
	// future: an older request is a replay. Defaults to DefaultTolerance, 5
	// minutes.
	Tolerance time.Duration
}

// Verify implements Verifier.
func (v SignatureVerifier) Verify(r *http.Request, body []byte, secrets [][]byte, now time.Time) error {
	header := v.Header
	if header == "" {
		header = DefaultHeader
	}
	tolerance := v.Tolerance
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	// An empty secret is known to everyone: it signs nothing.
	secrets = slices.DeleteFunc(slices.Clone(secrets), func(s []byte) bool { return len(s) == 0 })
	if len(secrets) == 0 {
		return ErrNoSecrets
	}
	values := r.Header.Values(header)
	switch {
	case len(values) == 0:
		return fmt.Errorf("%w: %s", ErrNoSignature, header)
	case len(values) > 1:
		return fmt.Errorf("%w: the %s header is sent %d times", ErrMalformedSignature, header, len(values))
	}
	ts, sigs, err := parseSignature(values[0])
	if err != nil {
		return err
	}
	unix, _ := strconv.ParseInt(ts, 10, 64) // digits only, checked
	t := time.Unix(unix, 0)
	if d := now.Sub(t); d > tolerance || d < -tolerance {
		when := d.Round(time.Second).String() + " ago"
		if d < 0 {
			when = (-d).Round(time.Second).String() + " ahead"
		}
		return fmt.Errorf("%w: signed at %s, %s (tolerance %s)",
			ErrTimestampOutOfTolerance, t.UTC().Format(time.RFC3339), when, tolerance)
	}
	matched := false
	for _, secret := range secrets {
		mac := sign(secret, ts, body)
		for _, sig := range sigs {
			// No early return: the time taken does not tell which entry, or
			// which secret, matched.
			if hmac.Equal(mac, sig) {
				matched = true
			}
		}
	}
	if !matched {
		return ErrSignatureMismatch
	}
	return nil
}

// parseSignature reads "t=<digits>,v1=<hex>[,v1=<hex>...]": the timestamp as
// written, and the v1 signatures decoded.
func parseSignature(value string) (string, [][]byte, error) {
	var ts string
	var sigs [][]byte
	for item := range strings.SplitSeq(value, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return "", nil, fmt.Errorf("%w: %q is not key=value", ErrMalformedSignature, item)
		}
		switch k {
		case "t":
			if ts != "" {
				return "", nil, fmt.Errorf("%w: two timestamps", ErrMalformedSignature)
			}
			if !isTimestamp(v) {
				return "", nil, fmt.Errorf("%w: the timestamp %q is not unix seconds", ErrMalformedSignature, v)
			}
			ts = v
		case "v1":
			sig, err := hex.DecodeString(v)
			if err != nil || len(sig) != sha256.Size {
				return "", nil, fmt.Errorf("%w: a v1 signature is not %d hex digits", ErrMalformedSignature, 2*sha256.Size)
			}
			sigs = append(sigs, sig)
		}
	}
	switch {
	case ts == "":
		return "", nil, fmt.Errorf("%w: no timestamp (t=)", ErrMalformedSignature)
	case len(sigs) == 0:
		return "", nil, fmt.Errorf("%w: no v1 signature", ErrMalformedSignature)
	}
	return ts, sigs, nil
}

// isTimestamp reports whether s is 1 to 18 decimal digits (ParseInt alone
// would take a sign).
func isTimestamp(s string) bool {
	if len(s) == 0 || len(s) > 18 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func sign(secret []byte, ts string, body []byte) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// Sign returns the value of the signature header of body signed with secret at
// t (in whole seconds), as SignatureVerifier reads it:
// "t=<unix seconds>,v1=<hex HMAC-SHA256>". It is for senders: a fake provider,
// a test. (A provider that signs with two secrets during a rotation sends one
// t= entry and a v1= entry per secret.)
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(sign(secret, ts, body))
}
