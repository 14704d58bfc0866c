package idempotency_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idempotency"
)

func TestCanonicalNumber(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"0.000", "0"}, {"0e99", "0"}, {"-0.0e-5", "0"},
		{"1", "1"}, {"1.0", "1"}, {"1e0", "1"}, {"10e-1", "1"}, {"1E+0", "1"}, {"0.1e1", "1"},
		{"-1.50", "-1.5"}, {"100", "100"}, {"1e2", "100"}, {"1.5e3", "1500"},
		{"123456789012345678901", "123456789012345678901"},
		{"1e21", "1e21"}, {"1234567890123456789012", "1.234567890123456789012e21"},
		{"0.000001", "0.000001"}, {"1e-6", "0.000001"}, {"1e-7", "1e-7"}, {"0.00000012", "1.2e-7"},
		{"12.345", "12.345"}, {"-0.5", "-0.5"},
		{"9007199254740993", "9007199254740993"}, // beyond float64: still exact
		{"1e999999999999999999999", "1e999999999999999999999"},
		{"15e-999999999999999999999", "1.5e-999999999999999999998"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, idempotency.CanonicalNumber(tt.in))
		})
	}
}

func TestFieldHashes(t *testing.T) {
	t.Parallel()
	hashes := func(t *testing.T, body string) map[string]string {
		t.Helper()
		h, err := idempotency.FieldHashes([]byte(body))
		require.NoError(t, err)
		return h
	}

	t.Run("Equal", func(t *testing.T) {
		t.Parallel()
		for _, pair := range [][2]string{
			{`{"a":1}`, `{"a":1.0}`},
			{`{"a":1}`, `{"a":1e0}`},
			{`{"a":[1,{"x":"y","z":null}]}`, "{ \"a\" : [ 1.00 , { \"z\" : null , \"x\" : \"\\u0079\" } ] }"},
			{`{"a":"é"}`, `{"a":"\u00e9"}`},
			{`{"a":"😀"}`, `{"a":"\ud83d\ude00"}`},
			{`{"a":"/"}`, `{"a":"\/"}`},
			{`{"a":{"b":{},"c":[]}}`, `{"a":{"c":[ ],"b":{ }}}`},
		} {
			require.Equal(t, hashes(t, pair[0])["a"], hashes(t, pair[1])["a"], "%s and %s", pair[0], pair[1])
		}
	})

	t.Run("Different", func(t *testing.T) {
		t.Parallel()
		values := []string{`1`, `-1`, `1.5`, `"1"`, `true`, `false`, `null`, `[]`, `{}`, `[1]`, `[[1]]`, `{"b":1}`, `{"b":"1"}`,
			`[1,2]`, `[2,1]`, `""`, `" "`, `"a"`, `"A"`, `{"b":null}`, `9007199254740992`, `9007199254740993`, `1e400`, `1e-400`}
		seen := map[string]string{}
		for _, v := range values {
			h := hashes(t, `{"a":`+v+`}`)["a"]
			require.NotContains(t, seen, h, "%s and %s", v, seen[h])
			seen[h] = v
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		for _, body := range []string{``, `1`, `[]`, `"a"`, `{`, `{"a"}`, `{"a":1,}`, `{"a":1}{}`, `{"a":1} x`, `{a:1}`,
			`{"a":01}`, `{"a":[1,]}`, `{"a":1,"a":1}`, `{"a":{"b":1,"b":2}}`, "{\"a\":\"\xff\"}", `{"a":NaN}`} {
			_, err := idempotency.FieldHashes([]byte(body))
			require.Error(t, err, "%s", body)
		}
	})
}

// FuzzFingerprint checks that parsing a body never panics, that a body written
// differently but equal as JSON (keys reordered, white space added, strings
// escaped, numbers written another way) gives the same field hashes, and that
// changing one field's value changes that field's hash and no other.
func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{
		`{"orderId":"A-1042","amount":1499,"metadata":{"note":"x"}}`,
		`{"a":1,"b":1.0,"c":1e0,"d":-0,"e":[true,false,null],"f":{"z":{},"y":[]}}`,
		`{"s":"\u00e9\ud83d\ude00\"\\\/\b\f\n\r\t","n":123456789012345678901234567890e-30}`,
		`{"a":{"a":{"a":{"a":[[[[1]]]]}}}}`,
		`{"a":1,"a":2}`, `[1]`, `{}`, `{"":""}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		hashes, err := idempotency.FieldHashes(body)
		if err != nil {
			return
		}
		var v map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&v), "a body that parses is JSON")
		require.Len(t, hashes, len(v))

		again, err := idempotency.FieldHashes([]byte(rewrite(v)))
		require.NoError(t, err)
		require.Equal(t, hashes, again, "the same value written differently")

		for name := range v {
			changed := map[string]any{}
			for k, x := range v {
				changed[k] = x
			}
			changed[name] = []any{v[name]}
			other, err := idempotency.FieldHashes([]byte(rewrite(changed)))
			require.NoError(t, err)
			for k := range v {
				if k == name {
					require.NotEqual(t, hashes[k], other[k], "field %q changed", k)
				} else {
					require.Equal(t, hashes[k], other[k], "field %q did not change", k)
				}
			}
		}
	})
}

// rewrite writes v as JSON unlike encoding/json: object keys in reverse order,
// white space everywhere, every character of a string as a \u escape, and every
// number in another form of the same value.
func rewrite(v any) string {
	var b strings.Builder
	var write func(v any)
	write = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range v {
					if !yield(k) {
						return
					}
				}
			})
			slices.Reverse(keys)
			b.WriteString("{ ")
			for i, k := range keys {
				if i > 0 {
					b.WriteString(" ,\n")
				}
				write(k)
				b.WriteString(" :\t")
				write(v[k])
			}
			b.WriteString(" }")
		case []any:
			b.WriteString("[ ")
			for i, x := range v {
				if i > 0 {
					b.WriteString(" , ")
				}
				write(x)
			}
			b.WriteString(" ]")
		case string:
			b.WriteByte('"')
			for _, u := range utf16.Encode([]rune(v)) {
				fmt.Fprintf(&b, `\u%04x`, u)
			}
			b.WriteByte('"')
		case json.Number:
			mant, exp, hasExp := strings.Cut(strings.ToLower(string(v)), "e")
			if strings.Contains(mant, ".") {
				mant += "0"
			} else {
				mant += ".0"
			}
			if !hasExp {
				exp = "0"
			}
			b.WriteString(mant + "E" + exp)
		case bool:
			b.WriteString(strconv.FormatBool(v))
		case nil:
			b.WriteString("null")
		}
	}
	write(v)
	return b.String()
}

var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)

// FuzzCanonicalNumber checks the canonical form of numbers against exact
// rational arithmetic: two numbers have the same form exactly when they are
// equal, and the form is a JSON number of the same value.
func FuzzCanonicalNumber(f *testing.F) {
	for _, pair := range [][2]string{{"1", "1.0"}, {"1e2", "100"}, {"-0", "0"}, {"0.1", "1e-1"}, {"1.5", "15e-1"}, {"1e21", "1e22"}, {"12", "21"}} {
		f.Add(pair[0], pair[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !jsonNumber.MatchString(a) || !jsonNumber.MatchString(b) || hugeExponent(a) || hugeExponent(b) {
			return
		}
		ca, cb := idempotency.CanonicalNumber(a), idempotency.CanonicalNumber(b)
		require.True(t, jsonNumber.MatchString(ca), "%s gives %s", a, ca)
		ra, rb := rat(t, a), rat(t, b)
		require.Zero(t, ra.Cmp(rat(t, ca)), "%s gives %s", a, ca)
		require.Equal(t, ra.Cmp(rb) == 0, ca == cb, "%s (%s) and %s (%s)", a, ca, b, cb)
	})
}

// hugeExponent reports whether n has an exponent too large for big.Rat to be
// quick about.
func hugeExponent(n string) bool {
	_, exp, ok := strings.Cut(strings.ToLower(n), "e")
	return ok && len(strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")) > 3
}

func rat(t *testing.T, n string) *big.Rat {
	r, ok := new(big.Rat).SetString(n)
	require.True(t, ok, "%s", n)
	return r
}

func BenchmarkFieldHashes(b *testing.B) {
	body := []byte(`{"orderId":"engine-20009","amount":100}`)
	for b.Loop() {
		if _, err := idempotency.FieldHashes(body); err != nil {
			b.Fatal(err)
		}
	}
}
