package idempotency

import (
	"errors"
	"strings"
)

// MaxKeyLen is the longest idempotency key accepted, in bytes.
const MaxKeyLen = 255

var (
	errKeyMissing = errors.New("the Idempotency-Key header is required")
	errKeyInvalid = errors.New("the Idempotency-Key header must be 1 to 255 visible ASCII characters (0x21 to 0x7E), bare or as a quoted structured-field string")
)

// parseKey returns the idempotency key of a request from the values of its
// Idempotency-Key header fields. A value that starts with a double quote is a
// structured-field string (RFC 8941, section 3.3.3): the key is its content,
// unescaped, so "abc" and abc are the same key. Any other value is the key as is.
// Either way the key must be 1 to MaxKeyLen characters from 0x21 to 0x7E.
func parseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errKeyMissing
	case 1:
	default:
		return "", errKeyInvalid
	}
	key := values[0]
	if strings.HasPrefix(key, `"`) {
		var ok bool
		if key, ok = unquote(key); !ok {
			return "", errKeyInvalid
		}
	}
	if len(key) == 0 || len(key) > MaxKeyLen {
		return "", errKeyInvalid
	}
	for i := range len(key) {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", errKeyInvalid
		}
	}
	return key, nil
}

// unquote returns the content of the structured-field string s: a double quote,
// characters from 0x20 to 0x7E where a double quote or a backslash is escaped by
// a backslash, and a closing double quote that ends s.
func unquote(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	s = s[1 : len(s)-1]
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"', c < 0x20, c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
