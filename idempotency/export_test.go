package idempotency

// Hooks into the unexported parsers for the fuzz tests.
var (
	ParseKey        = parseKey
	CanonicalNumber = canonicalNumber
)

// FieldHashes returns the hash of each top-level field of body, as the
// fingerprint stores them.
func FieldHashes(body []byte) (map[string]string, error) {
	b, err := parseBody(body)
	if err != nil {
		return nil, err
	}
	return b.hashes, nil
}
