package engine

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/fieldhash"
)

// fingerprintByMap is fingerprintOf as it was before forEachMember: the input
// decoded into a map of json.RawMessage, then each field hashed. What it
// answers is what the fingerprints stored before answered, so fingerprintOf
// must answer the same.
func fingerprintByMap(raw []byte, ignore []string) (*Fingerprint, error) {
	fp := &Fingerprint{Fields: map[string]string{}}
	if len(raw) == 0 || raw[0] != '{' {
		c, err := canonical(raw)
		if err != nil {
			return nil, err
		}
		fp.Fields[""] = fieldhash.Of(c)
		return fp, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	for name, v := range fields {
		if slices.Contains(ignore, name) {
			continue
		}
		c, err := canonical(v)
		if err != nil {
			return nil, err
		}
		fp.Fields[name] = fieldhash.Of(c)
	}
	return fp, nil
}

func TestFingerprintOfObjects(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{}`,
		`{ }`,
		` { } `, // not an object to fingerprintOf, which reads the first byte
		`{"client":"bench","orderId":"engine-1","amount":100}`,
		"{\n\t\"client\" : \"bench\" ,\r\n \"amount\":\t-1.5e+3 }",
		`{"a":true,"b":false,"c":null,"d":0,"e":-0.25,"f":1E9}`,
		`{"nested":{"z":1,"a":[1,{"b":"}]\"{["},[]]},"after":"x"}`,
		`{"s":"quote \" backslash \\ brace } bracket ] comma ,","t":"\u00e9\ud83d\ude00"}`,
		`{"a\u0062":1,"ab":2}`,        // the same name twice, once escaped: the last wins
		`{"k":1,"k":{"x":2},"k":[3]}`, // three times
		`{"é":"accent","日本":"name","\\":"backslash","\"":"quote","":"empty"}`,
		`{"deep":[[[[{"a":[[[]]]}]]]],"m":{"b":2,"a":1}}`,
		`{"metadata":{"b":[2,1],"a":{"d":4,"c":3}},"amount":100}`,
		`{"big":123456789012345678901234567890,"exp":1.0e-10}`,
		"{\"bad\xffname\":1,\"bad value\":\"\xfe\"}", // invalid UTF-8, as a stored input could hold
	} {
		for _, ignore := range [][]string{nil, {"amount"}, {"k", "ab", "é"}} {
			want, err := fingerprintByMap([]byte(in), ignore)
			require.NoError(t, err, in)
			got, err := fingerprintOf([]byte(in), ignore)
			require.NoError(t, err, in)
			require.Equal(t, want, got, "%s, ignoring %v", in, ignore)
		}
	}
}

func TestFingerprintOfNotAnObject(t *testing.T) {
	t.Parallel()
	for _, in := range []string{`"a string"`, `42`, `[1,2]`, `null`} {
		fp, err := fingerprintOf([]byte(in), nil)
		require.NoError(t, err, in)
		require.Len(t, fp.Fields, 1, in)
		require.Contains(t, fp.Fields, "", in)
	}
	for _, in := range []string{`{`, `{"a":}`, `{"a":1,}`, `{"a" 1}`, `{"a":1} x`, `{a:1}`} {
		_, err := fingerprintOf([]byte(in), nil)
		require.Error(t, err, in)
		_, want := fingerprintByMap([]byte(in), nil)
		require.Equal(t, want.Error(), err.Error(), in)
	}
}

func BenchmarkFingerprintOf(b *testing.B) {
	raw := []byte(`{"client":"bench","orderId":"engine-20009","amount":100}`)
	for b.Loop() {
		if _, err := fingerprintOf(raw, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFingerprintEncode checks that encode writes what json.Marshal writes of
// the stored form, byte for byte, plain or not.
func TestFingerprintEncode(t *testing.T) {
	t.Parallel()
	hashes, err := fingerprintOf([]byte(`{"client":"c","orderId":"o-1","amount":100,"note":"x"}`), nil)
	require.NoError(t, err)
	tests := []struct {
		name string
		fp   Fingerprint
	}{
		{"nil fields", Fingerprint{}},
		{"empty fields", Fingerprint{Fields: map[string]string{}}},
		{"hashes", *hashes},
		{"with context", Fingerprint{Fields: hashes.Fields, Context: map[string]string{"method": "POST", "path": "/refunds"}}},
		{"empty context", Fingerprint{Fields: hashes.Fields, Context: map[string]string{}}},
		{"the field of a non-object", Fingerprint{Fields: map[string]string{"": "abc"}}},
		{"quote and backslash", Fingerprint{Fields: map[string]string{`a"b\c`: "h"}}},
		{"html", Fingerprint{Fields: map[string]string{"<a&b>": "h"}, Context: map[string]string{"path": "/x?a=1&b=<2>"}}},
		{"control and DEL", Fingerprint{Fields: map[string]string{"a\nb\x7f": "h\t"}}},
		{"unicode", Fingerprint{Fields: map[string]string{"süß": "h", "\u2028": "h"}}},
		{"invalid UTF-8", Fingerprint{Context: map[string]string{"path": "/\xff"}}},
	}
	for _, tc := range tests {
		want, err := json.Marshal(storedFingerprint{V: fingerprintVersion, Fields: tc.fp.Fields, Context: tc.fp.Context})
		require.NoError(t, err)
		got := tc.fp.encode()
		require.Equal(t, string(want), string(got), tc.name)
		back := decodeFingerprint(got)
		require.Equal(t, len(tc.fp.Fields), len(back.Fields), tc.name)
	}
}

func BenchmarkFingerprintEncode(b *testing.B) {
	fp, err := fingerprintOf([]byte(`{"client":"bench","orderId":"engine-20009","amount":100}`), nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		_ = fp.encode()
	}
}
