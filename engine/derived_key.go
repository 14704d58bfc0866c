package engine

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
)

// DerivedKeyPrefix starts every derived idempotency key and names the scheme's
// version, so that a future scheme cannot produce a key of this one.
const DerivedKeyPrefix = "idf1_"

// DerivedKey returns the idempotency key that an external step sends to the outside
// service: DerivedKeyPrefix followed by the unpadded base64url SHA-256 of the
// operation name, the client scope, the client's idempotency key and the step name,
// each preceded by its length as a 4-byte big-endian integer (so no two different
// tuples share an encoding). It is 48 characters of [A-Za-z0-9_-], within the 255
// that Stripe accepts, and the same on every attempt, in every process.
func DerivedKey(operation, scope, key, step string) string {
	h := sha256.New()
	var n [4]byte
	for _, s := range [...]string{operation, scope, key, step} {
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return DerivedKeyPrefix + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
