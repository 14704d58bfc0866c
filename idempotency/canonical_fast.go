package idempotency

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/internal/fieldhash"
)

// parseBodyFast is parseBody for the bodies clients send: valid JSON without
// duplicate keys, nested less than MaxDepth. It reads the body once, byte by
// byte, where parseBody's decoder makes a token (and allocations) of every
// value. It answers ok false for any other body, which parseBody then reads
// itself, for the error it gives. What it returns when ok is what parseBody
// returns (TestParseBodyFast compares the two, FuzzParseBodyFast too).
func parseBodyFast(data []byte) (_ *parsedBody, ok bool) {
	if !utf8.Valid(data) || !json.Valid(data) {
		return nil, false
	}
	s := scanner{data: data}
	s.space()
	if s.peek() != '{' {
		return nil, false
	}
	s.i++
	b := &parsedBody{fields: Fields{}, hashes: map[string]string{}}
	var canon []byte
	ok = s.members(func(name string) bool {
		if _, dup := b.fields[name]; dup {
			return false
		}
		start := s.i
		var ok bool
		if canon, ok = s.value(canon[:0], 1); !ok {
			return false
		}
		b.fields[name] = json.RawMessage(data[start:s.i])
		b.hashes[name] = fieldhash.Of(canon)
		return true
	})
	if !ok {
		return nil, false
	}
	return b, true
}

// scanner reads data, which is valid JSON (json.Valid) and valid UTF-8. Its
// methods answer ok false where what they read is beyond parseBodyFast.
type scanner struct {
	data []byte
	i    int
}

func (s *scanner) peek() byte {
	if s.i < len(s.data) {
		return s.data[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// str reads a string and returns it quoted as in the body, and whether it
// holds an escape.
func (s *scanner) str() (quoted []byte, escaped bool) {
	start := s.i
	s.i++ // the opening quote
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case '\\':
			escaped = true
			s.i += 2
			continue
		case '"':
			s.i++
			return s.data[start:s.i], escaped
		}
		s.i++
	}
	return s.data[start:], escaped
}

// key reads an object's key and returns it decoded.
func (s *scanner) key() (string, bool) {
	if s.peek() != '"' {
		return "", false
	}
	quoted, escaped := s.str()
	if !escaped {
		return string(quoted[1 : len(quoted)-1]), true
	}
	var name string
	if err := json.Unmarshal(quoted, &name); err != nil {
		return "", false
	}
	return name, true
}

// value reads a value and appends its canonical form (see canonicalValue) to
// canon. depth counts the arrays and objects around it.
func (s *scanner) value(canon []byte, depth int) ([]byte, bool) {
	switch c := s.peek(); {
	case c == '"':
		quoted, escaped := s.str()
		return appendCanonicalString(canon, quoted, escaped)
	case c == '-' || c >= '0' && c <= '9':
		start := s.i
		for s.i < len(s.data) && strings.IndexByte("+-.0123456789eE", s.data[s.i]) >= 0 {
			s.i++
		}
		return append(canon, canonicalNumber(string(s.data[start:s.i]))...), true
	case c == 't':
		s.i += len("true")
		return append(canon, "true"...), true
	case c == 'f':
		s.i += len("false")
		return append(canon, "false"...), true
	case c == 'n':
		s.i += len("null")
		return append(canon, "null"...), true
	case depth >= MaxDepth:
		return nil, false
	case c == '[':
		s.i++
		canon = append(canon, '[')
		for first := true; ; first = false {
			s.space()
			if s.peek() == ']' {
				s.i++
				return append(canon, ']'), true
			}
			if !first {
				s.i++ // the comma
				s.space()
				canon = append(canon, ',')
			}
			var ok bool
			if canon, ok = s.value(canon, depth+1); !ok {
				return nil, false
			}
		}
	case c == '{':
		return s.object(canon, depth)
	}
	return nil, false
}

// member is an object's member: its key, decoded, and its value's canonical
// form.
type member struct {
	key   string
	canon []byte
}

// members reads the members of an object whose '{' it is past, to its '}':
// for each it reads the key, then calls member with the key decoded and the
// scanner at the value, which member reads. It stops at the first false.
func (s *scanner) members(member func(key string) bool) bool {
	for first := true; ; first = false {
		s.space()
		if s.peek() == '}' {
			s.i++
			return true
		}
		if !first {
			s.i++ // the comma
			s.space()
		}
		key, ok := s.key()
		if !ok {
			return false
		}
		s.space()
		s.i++ // the colon
		s.space()
		if !member(key) {
			return false
		}
	}
}

func (s *scanner) object(canon []byte, depth int) ([]byte, bool) {
	s.i++
	var members []member
	ok := s.members(func(key string) bool {
		m := member{key: key}
		var ok bool
		m.canon, ok = s.value(nil, depth+1)
		members = append(members, m)
		return ok
	})
	if !ok {
		return nil, false
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	canon = append(canon, '{')
	for i, m := range members {
		if i > 0 {
			if m.key == members[i-1].key {
				return nil, false // a duplicate key
			}
			canon = append(canon, ',')
		}
		canon = appendString(canon, m.key)
		canon = append(canon, ':')
		canon = append(canon, m.canon...)
	}
	return append(canon, '}'), true
}

// appendCanonicalString appends the string quoted (as in the body) as
// encoding/json writes it, which is how the body has it when it holds no
// escape and none of the characters encoding/json escapes.
func appendCanonicalString(canon, quoted []byte, escaped bool) ([]byte, bool) {
	if !escaped && plainString(quoted[1:len(quoted)-1]) {
		return append(canon, quoted...), true
	}
	var v string
	if err := json.Unmarshal(quoted, &v); err != nil {
		return nil, false
	}
	return appendString(canon, v), true
}

// appendString appends v as encoding/json writes it (see writeString).
func appendString(canon []byte, v string) []byte {
	if plainString([]byte(v)) && !strings.ContainsAny(v, "\"\\") {
		canon = append(canon, '"')
		canon = append(canon, v...)
		return append(canon, '"')
	}
	var w bytes.Buffer
	writeString(&w, v)
	return append(canon, w.Bytes()...)
}

// plainString reports whether encoding/json writes the string s (valid UTF-8,
// no quote or backslash unescaped) as it is: it escapes control characters,
// <, > and & for HTML, and U+2028 and U+2029 (whose UTF-8 begins with 0xE2).
func plainString(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0xE2 {
			return false
		}
	}
	return true
}
