package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strings"

	"github.com/google/uuid"
)

// The prefixes of derived keys name the scheme, so that no key of one scheme is
// a key of another.
const (
	// derivedKeyPrefix starts the derived keys of operations reserved by this
	// version (scheme 3: the operation's id, then a digest of its id, its
	// random secret and the step's name).
	derivedKeyPrefix = "idf3_"
	// derivedKeyPrefixV2 and derivedKeyPrefixV1 started the keys of schemes 2
	// (a digest of the id, the secret and the step, without the id) and 1 (a
	// digest of public values only), which operations reserved before them
	// keep.
	derivedKeyPrefixV2 = "idf2_"
	derivedKeyPrefixV1 = "idf1_"
)

// Operations' secrets: scheme 3's are a scheme byte then 16 random bytes;
// scheme 2's were the 16 random bytes alone; scheme 1 had none.
const (
	keySecretRandom = 16
	keySecretSize   = 1 + keySecretRandom
	keyScheme3      = 3
)

// scheme3Digest is how many bytes of the digest a scheme 3 key carries after
// the operation's id: 36 bytes in all, 48 characters of base64.
const scheme3Digest = 20

// newKeySecret returns a new operation's secret for its derived keys (scheme 3).
func newKeySecret() []byte {
	b := make([]byte, keySecretSize)
	b[0] = keyScheme3
	_, _ = rand.Read(b[1:]) // never fails (crypto/rand panics instead)
	return b
}

// derivedKey returns the idempotency key that an external step sends to the
// outside service, the same on every attempt, in every process.
//
// Scheme 3 (derivedKeyPrefix) is the unpadded base64url of the operation's
// 16-byte id followed by the first 20 bytes of the SHA-256 of its id, its
// secret and the step's name, each preceded by its length as a 4-byte
// big-endian integer: 53 characters of [A-Za-z0-9_-] in all, within the 255
// that Stripe accepts. The id lets reconciliation find the operation of a
// record at the service without an index of keys (operationOfKey); the
// digest, which nobody who lacks the database can compute, makes the key
// unguessable and new for a new operation under a client key used before
// (after retention deleted the old one), so that it never meets the old
// operation's records at the service. Scheme 2, for operations whose secret
// is the 16 random bytes alone, was the digest without the id; scheme 1, for
// operations without a secret, a digest of the operation's name, the scope,
// the client's key and the step's name.
func derivedKey(id uuid.UUID, secret []byte, operation, scope, key, step string) string {
	// The fields go into one buffer, hashed at once: no hash.Hash to allocate.
	var arr [256]byte
	buf := arr[:0]
	switch {
	case len(secret) == 0:
		for _, s := range [...]string{operation, scope, key, step} {
			buf = appendField(buf, s)
		}
		return encodeKey(derivedKeyPrefixV1, nil, buf)
	case len(secret) == keySecretRandom:
		buf = appendField(buf, string(id[:]))
		buf = appendField(buf, string(secret))
		buf = appendField(buf, step)
		return encodeKey(derivedKeyPrefixV2, nil, buf)
	default:
		buf = appendField(buf, string(id[:]))
		buf = appendField(buf, string(secret))
		buf = appendField(buf, step)
		return encodeKey(derivedKeyPrefix, id[:], buf)
	}
}

// encodeKey returns prefix and the base64 of head followed by the digest of
// fields: all of it without head, scheme3Digest bytes of it after one.
func encodeKey(prefix string, head, fields []byte) string {
	sum := sha256.Sum256(fields)
	raw := sum[:]
	if head != nil {
		var b [16 + scheme3Digest]byte
		copy(b[copy(b[:], head):], sum[:scheme3Digest])
		raw = b[:]
	}
	var out [len(derivedKeyPrefix) + 48]byte // the longest: scheme 3's
	n := copy(out[:], prefix)
	end := n + base64.RawURLEncoding.EncodedLen(len(raw))
	base64.RawURLEncoding.Encode(out[n:end], raw)
	return string(out[:end])
}

// operationOfKey returns the operation id that a scheme 3 key carries, or
// false for a key of another scheme or none of the engine's. The id is only a
// claim: the key is the operation's once derivedKey gives it again from the
// operation's row.
func operationOfKey(key string) (uuid.UUID, bool) {
	rest, ok := strings.CutPrefix(key, derivedKeyPrefix)
	if !ok || len(rest) != base64.RawURLEncoding.EncodedLen(16+scheme3Digest) {
		return uuid.Nil, false
	}
	var b [16 + scheme3Digest]byte
	if n, err := base64.RawURLEncoding.Decode(b[:], []byte(rest)); err != nil || n != len(b) {
		return uuid.Nil, false
	}
	return uuid.UUID(b[:16]), true
}

// olderKeyScheme reports whether key is of a scheme before 3: its operation
// cannot be found from it.
func olderKeyScheme(key string) bool {
	return strings.HasPrefix(key, derivedKeyPrefixV2) || strings.HasPrefix(key, derivedKeyPrefixV1)
}

// appendField appends s preceded by its length as a 4-byte big-endian integer.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
