package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"

	"github.com/google/uuid"
)

// The prefixes of derived keys name the scheme, so that no key of one scheme is
// a key of another.
const (
	// DerivedKeyPrefix starts the derived keys of operations reserved by this
	// version (scheme 2: from the operation's id and its random secret).
	DerivedKeyPrefix = "idf2_"
	// derivedKeyPrefixV1 started the keys of scheme 1, from public values only,
	// which operations reserved before scheme 2 keep.
	derivedKeyPrefixV1 = "idf1_"
)

// keySecretSize is the size of an operation's secret, chosen at reservation.
const keySecretSize = 16

// newKeySecret returns a new operation's secret for its derived keys.
func newKeySecret() []byte {
	b := make([]byte, keySecretSize)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b
}

// derivedKey returns the idempotency key that an external step sends to the
// outside service, the same on every attempt, in every process.
//
// Scheme 2 (DerivedKeyPrefix) is the unpadded base64url SHA-256 of the
// operation's id, its secret (16 random bytes chosen at reservation and kept
// in its row) and the step's name, each preceded by its length as a 4-byte
// big-endian integer: a new operation under a client key used before (after
// retention deleted the old one) gets new keys, so it never meets the old
// operation's records at the provider, and nobody who lacks the database can
// compute a key in advance. Scheme 1, for operations whose row has no secret,
// hashed the operation's name, the scope, the client's key and the step's
// name. Either way the key is 48 characters of [A-Za-z0-9_-], within the 255
// that Stripe accepts.
func derivedKey(id uuid.UUID, secret []byte, operation, scope, key, step string) string {
	// The fields go into one buffer, hashed at once: no hash.Hash to allocate.
	var arr [256]byte
	buf := arr[:0]
	prefix := DerivedKeyPrefix
	if len(secret) == 0 {
		prefix = derivedKeyPrefixV1
		for _, s := range [...]string{operation, scope, key, step} {
			buf = appendField(buf, s)
		}
	} else {
		buf = appendField(buf, string(id[:]))
		buf = appendField(buf, string(secret))
		buf = appendField(buf, step)
	}
	sum := sha256.Sum256(buf)
	var out [len(DerivedKeyPrefix) + 43]byte // 43: 32 bytes in unpadded base64
	n := copy(out[:], prefix)
	base64.RawURLEncoding.Encode(out[n:], sum[:])
	return string(out[:])
}

// appendField appends s preceded by its length as a 4-byte big-endian integer.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
