package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idempotency"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []string
		want   string // empty: invalid
	}{
		{name: "Bare", values: []string{"8e03978e"}, want: "8e03978e"},
		{name: "Quoted", values: []string{`"8e03978e"`}, want: "8e03978e"},
		{name: "QuotedEscapes", values: []string{`"a\"b\\c"`}, want: `a"b\c`},
		{name: "BareWithQuoteInside", values: []string{`a"b`}, want: `a"b`},
		{name: "BareWithBackslash", values: []string{`a\b`}, want: `a\b`},
		{name: "BareEndingInQuote", values: []string{`ab"`}, want: `ab"`},
		{name: "AllVisible", values: []string{"!~"}, want: "!~"},
		{name: "Longest", values: []string{strings.Repeat("k", 255)}, want: strings.Repeat("k", 255)},
		{name: "LongestQuoted", values: []string{`"` + strings.Repeat("k", 255) + `"`}, want: strings.Repeat("k", 255)},
		{name: "Missing"},
		{name: "Empty", values: []string{""}},
		{name: "TooLong", values: []string{strings.Repeat("k", 256)}},
		{name: "TooLongQuoted", values: []string{`"` + strings.Repeat("k", 256) + `"`}},
		{name: "Space", values: []string{"a b"}},
		{name: "QuotedSpace", values: []string{`"a b"`}},
		{name: "Tab", values: []string{"a\tb"}},
		{name: "Delete", values: []string{"a\x7fb"}},
		{name: "NotASCII", values: []string{"clé"}},
		{name: "QuoteAlone", values: []string{`"`}},
		{name: "QuotedEmpty", values: []string{`""`}},
		{name: "Unterminated", values: []string{`"abc`}},
		{name: "EscapedClosingQuote", values: []string{`"abc\"`}},
		{name: "BadEscape", values: []string{`"a\bc"`}},
		{name: "QuoteInsideQuoted", values: []string{`"a"b"`}},
		{name: "Parameters", values: []string{`"abc";p=1`}},
		{name: "Twice", values: []string{"a", "b"}},
		{name: "TwiceSame", values: []string{"a", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idempotency.ParseKey(tt.values)
			if tt.want == "" {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseKey checks that the parser never panics, accepts only keys of 1 to 255
// visible ASCII characters, keeps a bare key as it is, and reads a key quoted as a
// structured-field string as the bare key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"8e03978e", `"8e03978e"`, `"a\"b\\c"`, `a"b`, `""`, `"`, "", "a b", strings.Repeat("k", 256)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := idempotency.ParseKey([]string{value})
		if err != nil {
			return
		}
		require.NotEmpty(t, key)
		require.LessOrEqual(t, len(key), idempotency.MaxKeyLen)
		for i := range len(key) {
			require.True(t, key[i] >= 0x21 && key[i] <= 0x7e, "byte %#x", key[i])
		}
		if !strings.HasPrefix(value, `"`) {
			require.Equal(t, value, key)
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := idempotency.ParseKey([]string{quoted})
		require.NoError(t, err)
		require.Equal(t, key, again)
	})
}
