package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/internal/fieldhash"
)

// Fingerprint is what tells a retry of a Start from a different Start under the
// same key: a hash of each top-level field of the input, and context that
// identifies the request besides its input. The engine makes one from the
// input (see OperationOpts.Unfingerprinted); a caller that knows better, such
// as an HTTP layer that fingerprints the request body and adds the method and
// the path, passes its own in StartOpts.Fingerprint.
type Fingerprint struct {
	// Fields maps a top-level field's name to a hash of its
	// canonical JSON (the first 16 bytes of its SHA-256, in unpadded
	// base64url). An input that is not a JSON object has one field, "".
	Fields map[string]string `json:"fields"`
	// Context maps names to values compared as they are, such as "method" and
	// "path". A context name that differs is reported like a field.
	Context map[string]string `json:"context,omitempty"`
}

// fingerprintVersion is the format of stored fingerprints: {"v":3,"fields":...,
// "context":...}, each field's hash fieldhash.Of's. Version 2 was the same with
// the whole SHA-256 in hex; version 1, written by the idempotency package
// before the engine fingerprinted, was {"method":...,"path":...,"fields":...}
// with those hashes. Both are read as version 3 (see decodeFingerprint).
const fingerprintVersion = 3

type storedFingerprint struct {
	V       int               `json:"v"`
	Fields  map[string]string `json:"fields"`
	Context map[string]string `json:"context,omitempty"`
	// Method and Path are version 1's context.
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
}

// encode returns the stored form of fp: what json.Marshal makes of its
// storedFingerprint, byte for byte, built by hand when every name and value is
// plain (see plainJSON), as field hashes and names are; json.Marshal of maps
// costs a start a few microseconds more.
func (fp *Fingerprint) encode() []byte {
	if !plainMap(fp.Fields) || !plainMap(fp.Context) {
		raw, _ := json.Marshal(storedFingerprint{V: fingerprintVersion, Fields: fp.Fields, Context: fp.Context}) // strings only
		return raw
	}
	b := make([]byte, 0, 32+40*(len(fp.Fields)+len(fp.Context)))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, fingerprintVersion, 10)
	b = append(b, `,"fields":`...)
	b = appendPlainMap(b, fp.Fields)
	if len(fp.Context) > 0 {
		b = append(b, `,"context":`...)
		b = appendPlainMap(b, fp.Context)
	}
	return append(b, '}')
}

// plainJSON reports whether json.Marshal writes s as it is between quotes:
// printable ASCII, without the characters it escapes (", \, and <, > and &,
// which it escapes for HTML).
func plainJSON(s string) bool {
	for i := range len(s) {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func plainMap(m map[string]string) bool {
	for k, v := range m {
		if !plainJSON(k) || !plainJSON(v) {
			return false
		}
	}
	return true
}

// appendPlainMap appends m as json.Marshal writes it, keys sorted; m's names
// and values are plain (see plainJSON).
func appendPlainMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	var stack [16]string
	keys := stack[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, `":"`...)
		b = append(b, m[k]...)
		b = append(b, '"')
	}
	return append(b, '}')
}

// decodeFingerprint reads a stored fingerprint, of either version. One that is
// absent or unreadable is empty: every field of a new start differs from it.
func decodeFingerprint(raw []byte) *Fingerprint {
	var s storedFingerprint
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return &Fingerprint{}
	}
	fp := &Fingerprint{Fields: s.Fields, Context: s.Context}
	if s.V < 2 {
		fp.Context = map[string]string{"method": s.Method, "path": s.Path}
	}
	if s.V < 3 {
		// A hex SHA-256 holds the bytes that fieldhash.Of keeps: the same field
		// compares equal across the deploy. Anything else stays as it is, and
		// differs from every hash.
		for name, h := range fp.Fields {
			if sum, err := hex.DecodeString(h); err == nil && len(sum) == sha256.Size {
				fp.Fields[name] = base64.RawURLEncoding.EncodeToString(sum[:fieldhash.Size])
			}
		}
	}
	return fp
}

// fingerprintOf fingerprints an encoded input, leaving out the fields in
// ignore. Each top-level value is hashed as encoding/json writes it after a
// round trip through any (objects with their members sorted), so that inputs
// equal as JSON values have equal fingerprints.
func fingerprintOf(raw []byte, ignore []string) (*Fingerprint, error) {
	fp := &Fingerprint{Fields: map[string]string{}}
	if len(raw) == 0 || raw[0] != '{' {
		c, err := canonical(raw)
		if err != nil {
			return nil, err
		}
		fp.Fields[""] = fieldhash.Of(c)
		return fp, nil
	}
	if !json.Valid(raw) {
		var fields map[string]json.RawMessage
		return nil, json.Unmarshal(raw, &fields) // its error says where
	}
	var err error
	forEachMember(raw, func(name string, v []byte) bool {
		if slices.Contains(ignore, name) {
			return true
		}
		var c []byte
		if c, err = canonical(v); err != nil {
			return false
		}
		fp.Fields[name] = fieldhash.Of(c) // a later member of the same name wins, as in encoding/json
		return true
	})
	if err != nil {
		return nil, err
	}
	return fp, nil
}

// forEachMember calls fn with the name and the value of each member of the
// JSON object obj, in order, until fn returns false: the value as its bytes,
// which is what a json.RawMessage of it holds. obj must be valid JSON (see
// json.Valid) and an object. It reads obj once, where decoding it into a map
// of json.RawMessage allocated a map and a copy of every value.
func forEachMember(obj []byte, fn func(name string, value []byte) bool) {
	i := skipSpace(obj, 1) // past the '{'
	for obj[i] == '"' {
		end := stringEnd(obj, i)
		name := memberName(obj[i:end])
		i = skipSpace(obj, skipSpace(obj, end)+1) // past the ':'
		vEnd := valueEnd(obj, i)
		if !fn(name, obj[i:vEnd]) {
			return
		}
		i = skipSpace(obj, vEnd)
		if obj[i] == ',' {
			i = skipSpace(obj, i+1)
		}
	}
}

// memberName is the name that encoding/json decodes from quoted, a JSON
// string: the bytes between the quotes when they are plain ASCII.
func memberName(quoted []byte) string {
	inner := quoted[1 : len(quoted)-1]
	for _, b := range inner {
		if b == '\\' || b >= utf8.RuneSelf {
			var name string
			_ = json.Unmarshal(quoted, &name) // valid: checked with the whole object
			return name
		}
	}
	return string(inner)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the closing quote of the JSON string that
// starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd returns the index after the JSON value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch b[i] {
			case '"':
				i = stringEnd(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	for i < len(b) && !strings.ContainsRune(",}] \t\n\r", rune(b[i])) {
		i++
	}
	return i
}

// canonical returns v as encoding/json writes it after a round trip through
// any; scalars, which encoding/json writes in one form already, are kept.
func canonical(v []byte) ([]byte, error) {
	if len(v) == 0 || v[0] != '{' && v[0] != '[' {
		return v, nil
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var x any
	if err := dec.Decode(&x); err != nil {
		return nil, err
	}
	return json.Marshal(x)
}

// mismatches returns, sorted, the names whose hashes or values differ between
// fp and stored (a name present in only one of them differs), leaving out the
// fields in ignore on both sides, so that a change to that list applies to
// operations stored before it.
func (fp *Fingerprint) mismatches(stored *Fingerprint, ignore []string) []string {
	var diff []string
	compare := func(a, b map[string]string, skip []string) {
		for name := range maps.Keys(a) {
			if slices.Contains(skip, name) {
				continue
			}
			if w, ok := b[name]; !ok || w != a[name] {
				diff = append(diff, name)
			}
		}
		for name := range maps.Keys(b) {
			if _, ok := a[name]; !ok && !slices.Contains(skip, name) {
				diff = append(diff, name)
			}
		}
	}
	compare(fp.Fields, stored.Fields, ignore)
	compare(fp.Context, stored.Context, nil)
	slices.Sort(diff)
	return slices.Compact(diff)
}
