package bearer

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestToken: the scheme in any case, spaces or tabs around and before
// the token, no other white space, nothing after it.
func TestToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer tok", "tok", true},
		{"bearer tok", "tok", true},
		{"BEARER\ttok", "tok", true},
		{"Bearer\t tok", "tok", true},
		{"  Bearer   tok \t", "tok", true},
		{"Bearer a.b-c_d~e+f/g=", "a.b-c_d~e+f/g=", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearertok", "", false},
		{"Basic tok", "", false},
		{"Bearer tok other", "", false},
		{"Bearer\u00a0tok", "", false},
		{"Bearer tok\u00a0", "", false},
		{"\u2003Bearer tok", "", false},
		{"Bearer tok\r\n", "", false},
		{"Bearer t\x00k", "", false},
	} {
		token, ok := Token(tt.header)
		require.Equal(t, tt.ok, ok, "%q", tt.header)
		require.Equal(t, tt.token, token, "%q", tt.header)
	}
}
