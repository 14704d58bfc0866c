// Package fieldhash is the hash that an operation's fingerprint keeps of each
// top-level field of its input, shared by the engine (which fingerprints an
// input it encodes) and package idempotency (which fingerprints a request's
// body without decoding it into the input), so that both agree byte for byte.
package fieldhash

import (
	"crypto/sha256"
	"encoding/base64"
)

// Size is how many bytes of a field's SHA-256 a fingerprint keeps: enough that
// two values with the same hash are never met, half the bytes to store with
// every operation.
const Size = 16

// Of returns the hash of a field whose value is canonical: the first 16 bytes
// of the SHA-256 of its bytes, in unpadded base64url (22 characters).
// Canonical JSON (object members sorted by key, no white space, numbers in one
// form) is the caller's to make.
func Of(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return base64.RawURLEncoding.EncodeToString(sum[:Size])
}
