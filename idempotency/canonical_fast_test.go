package idempotency

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fastBodies are bodies for TestParseBodyFast and seeds for FuzzParseBodyFast:
// some it reads, some it leaves to parseBodyTokens.
var fastBodies = []string{
	`{"orderId":"engine-20009","amount":100}`,
	` { "orderId" : "A-1" ,` + "\n\t" + `"amount" : 1499 , "metadata" : { "b" : [1, 2.50, -0, 1e3] , "a" : null } } `,
	`{}`, `{"":""}`, `{"a":true,"b":false,"c":null}`,
	`{"a":"<b>&amp;</b>","b":"\u2028 and \u2029","c":"é😀","d":"\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t"}`,
	`{"a\"b":1,"\u0061":2}`, `{"é":1,"e\u0301":2}`,
	`{"a":{"z":1,"y":{"x":[{"b":1,"a":2}]}}}`,
	`{"n":123456789012345678901234567890e-30,"m":-0.000001,"o":1E+21,"p":0}`,
	`{"s":"\ud800"}`, `{"s":"` + "\u2028" + `"}`,
	// Left to parseBodyTokens: its errors.
	`{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`, `{"a":[{"b":1,"c":2,"b":3}]}`, `{"a":1,"\u0061":2}`,
	`[1]`, `"a"`, `1`, ``, `{`, `{"a":1,}`, `{"a":1}{}`, `{"a":1} x`, `{a:1}`, `{"a":01}`, "{\"a\":\"\xff\"}",
	`{"a":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`,
	`{"a":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`,
	`{"a":` + strings.Repeat(`{"b":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth) + `}`,
}

// checkFast checks that parseBodyFast, when it reads body, answers what
// parseBodyTokens answers.
func checkFast(t *testing.T, body []byte) (read bool) {
	t.Helper()
	fast, ok := parseBodyFast(body)
	want, err := parseBodyTokens(body)
	if !ok {
		return false
	}
	require.NoError(t, err, "parseBodyFast read %q, which parseBodyTokens refuses", body)
	require.Equal(t, want.fields, fast.fields, "fields of %q", body)
	require.Equal(t, want.hashes, fast.hashes, "hashes of %q", body)
	return true
}

func TestParseBodyFast(t *testing.T) {
	t.Parallel()
	read := 0
	for _, body := range fastBodies {
		if checkFast(t, []byte(body)) {
			read++
		}
	}
	require.Equal(t, 13, read, "the bodies parseBodyFast reads itself")
	_, ok := parseBodyFast([]byte(`{"a":1,"a":2}`))
	require.False(t, ok, "a duplicate key is parseBodyTokens' to report")
}

func FuzzParseBodyFast(f *testing.F) {
	for _, body := range fastBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFast(t, body)
	})
}
