package webhook_test

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/entry/webhook"
)

var (
	secretOld = []byte("whsec_old")
	secretNew = []byte("whsec_new")
	// clock is the handlers' and the verifiers' now in the tests.
	clock = time.Unix(1_700_000_000, 0)
)

// v1 returns the v1 entry of Sign's value.
func v1(secret []byte, t time.Time, body []byte) string {
	_, entry, _ := strings.Cut(webhook.Sign(secret, t, body), ",")
	return entry
}

func TestSign(t *testing.T) {
	t.Parallel()
	// Stripe's scheme, computed independently:
	// printf '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_old
	got := webhook.Sign(secretOld, clock, []byte(`{"id":"evt_1"}`))
	require.Equal(t, "t=1700000000,v1=ef1b1b7e4b312671a75ef2a03e10529f7834a6528a49db77ad6568c8c8017843", got)
}

func TestSignatureVerifier(t *testing.T) {
	t.Parallel()
	body := []byte(`{"id":"evt_1","type":"payment.succeeded"}`)
	signed := func(secret []byte, at time.Time) string { return webhook.Sign(secret, at, body) }
	ts := "t=1700000000"

	tests := []struct {
		name    string
		headers []string // the values of the header; none: no header
		sendAs  string   // the header's name; defaults to DefaultHeader
		secrets [][]byte
		verify  webhook.SignatureVerifier
		want    error // nil: accepted
	}{
		{name: "valid", headers: []string{signed(secretOld, clock)}, secrets: [][]byte{secretOld}},
		{name: "second secret matches", headers: []string{signed(secretNew, clock)}, secrets: [][]byte{secretOld, secretNew}},
		{name: "several v1, the last matches", headers: []string{ts + "," + v1(secretNew, clock, body) + "," + v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}},
		{name: "spaces and other schemes ignored", headers: []string{ts + ", v0=abc , " + v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}},
		{name: "old at the edge of the tolerance", headers: []string{signed(secretOld, clock.Add(-5*time.Minute))}, secrets: [][]byte{secretOld}},
		{name: "future at the edge of the tolerance", headers: []string{signed(secretOld, clock.Add(5*time.Minute))}, secrets: [][]byte{secretOld}},
		{name: "custom tolerance", headers: []string{signed(secretOld, clock.Add(-time.Hour))}, secrets: [][]byte{secretOld}, verify: webhook.SignatureVerifier{Tolerance: 2 * time.Hour}},

		{name: "no header", secrets: [][]byte{secretOld}, want: webhook.ErrNoSignature},
		{name: "header named", headers: []string{signed(secretOld, clock)}, sendAs: "Stripe-Signature", secrets: [][]byte{secretOld}, verify: webhook.SignatureVerifier{Header: "Stripe-Signature"}},
		{name: "header under another name", headers: []string{signed(secretOld, clock)}, secrets: [][]byte{secretOld}, verify: webhook.SignatureVerifier{Header: "Stripe-Signature"}, want: webhook.ErrNoSignature},
		{name: "header twice", headers: []string{signed(secretOld, clock), signed(secretOld, clock)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "not key=value", headers: []string{"garbage"}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "empty", headers: []string{""}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "no timestamp", headers: []string{v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "no v1", headers: []string{ts + ",v0=abc"}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "two timestamps", headers: []string{ts + "," + signed(secretOld, clock)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "timestamp not digits", headers: []string{"t=17e8," + v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "timestamp signed", headers: []string{"t=+1700000000," + v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "v1 not hex", headers: []string{ts + ",v1=" + strings.Repeat("zz", 32)}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "v1 short", headers: []string{ts + ",v1=abcd"}, secrets: [][]byte{secretOld}, want: webhook.ErrMalformedSignature},
		{name: "wrong secret", headers: []string{signed(secretNew, clock)}, secrets: [][]byte{secretOld}, want: webhook.ErrSignatureMismatch},
		{name: "another body", headers: []string{webhook.Sign(secretOld, clock, []byte(`{"id":"evt_2"}`))}, secrets: [][]byte{secretOld}, want: webhook.ErrSignatureMismatch},
		{name: "timestamp changed", headers: []string{"t=1700000001," + v1(secretOld, clock, body)}, secrets: [][]byte{secretOld}, want: webhook.ErrSignatureMismatch},
		{name: "empty secret signs nothing", headers: []string{signed(nil, clock)}, secrets: [][]byte{{}}, want: webhook.ErrNoSecrets},
		{name: "no secrets", headers: []string{signed(secretOld, clock)}, want: webhook.ErrNoSecrets},
		{name: "old", headers: []string{signed(secretOld, clock.Add(-5*time.Minute-time.Second))}, secrets: [][]byte{secretOld}, want: webhook.ErrTimestampOutOfTolerance},
		{name: "future", headers: []string{signed(secretOld, clock.Add(5*time.Minute+time.Second))}, secrets: [][]byte{secretOld}, want: webhook.ErrTimestampOutOfTolerance},
		{name: "old and signed with no known secret", headers: []string{signed(secretNew, clock.Add(-time.Hour))}, secrets: [][]byte{secretOld}, want: webhook.ErrTimestampOutOfTolerance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			for _, h := range tt.headers {
				r.Header.Add(cmp.Or(tt.sendAs, webhook.DefaultHeader), h)
			}
			err := tt.verify.Verify(r, body, tt.secrets, clock)
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.want)
		})
	}
}
