package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAddresses: URLs of any scheme and network addresses are withheld, the
// rest of the text is kept.
func TestAddresses(t *testing.T) {
	t.Parallel()
	const w = Withheld
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"the provider's refund pr_1 is for order \"A-1\", amount 700", "the provider's refund pr_1 is for order \"A-1\", amount 700"},
		{"its lookup cannot answer: httpstep: read the answer of GET http://127.0.0.1:8080/provider/refunds/by-key/idf3_x: halt: provider_mismatch: the provider's refund pr_2",
			"its lookup cannot answer: httpstep: read the answer of GET " + w + ": halt: provider_mismatch: the provider's refund pr_2"},
		{`httpstep: Get "https://psp.internal:8443/v1/refunds?key=a": dial tcp 10.0.0.7:443: connect: connection refused`,
			`httpstep: Get "` + w + `": dial tcp ` + w + `: connect: connection refused`},
		{"dial tcp: lookup psp.internal on 127.0.0.53:53: no such host", "dial tcp: " + w + " on " + w + ": no such host"},
		{"connect to postgres://app:secret@db-1:5432/app failed", "connect to " + w + " failed"},
		{"dial tcp [fd00::7]:443: i/o timeout", "dial tcp " + w + ": i/o timeout"},
		{"read tcp 127.0.0.1:5555->provider.internal:443: connection reset by peer", "read tcp " + w + "->" + w + ": connection reset by peer"},
		{"write tcp provider.internal:443: broken pipe", "write tcp " + w + ": broken pipe"},
		{"failed to connect to `host=db.internal user=app`: db.internal:5432 (db.internal): dial error", "failed to connect to `host=db.internal user=app`: " + w + " (db.internal): dial error"},
		{"lookup psp.internal: no such host", "lookup " + w + ": no such host"},
		{"the refund [amount:1] is pending", "the refund [amount:1] is pending"},
		{"it will be known by 2026-12-07T05:00:00Z", "it will be known by 2026-12-07T05:00:00Z"},
		{"step provider has failed 10 times after the point of no return; retried every 5m0s", "step provider has failed 10 times after the point of no return; retried every 5m0s"},
	} {
		require.Equal(t, tt.want, Addresses(tt.in), tt.in)
	}
}
