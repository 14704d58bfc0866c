package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"

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
	h := sha256.New()
	if len(secret) == 0 {
		for _, s := range [...]string{operation, scope, key, step} {
			writeField(h, []byte(s))
		}
		return derivedKeyPrefixV1 + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
	}
	writeField(h, id[:])
	writeField(h, secret)
	writeField(h, []byte(step))
	return DerivedKeyPrefix + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

func writeField(h hash.Hash, b []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	h.Write(n[:])
	h.Write(b)
}
