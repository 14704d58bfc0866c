package idempotency

import (
	"slices"

	"github.com/idemflow/idemflow/engine"
)

// fingerprint returns what a request is recognised by when its key comes again:
// a hash of the canonical form of each fingerprinted top-level body field, and
// the method and the path as context. The engine stores it with the operation
// and compares it with a later start's (engine.StartOpts.Fingerprint).
func fingerprint(method, path string, hashes map[string]string, unfingerprinted []string) *engine.Fingerprint {
	fp := &engine.Fingerprint{
		Fields:  make(map[string]string, len(hashes)),
		Context: map[string]string{"method": method, "path": path},
	}
	for name, h := range hashes {
		if !slices.Contains(unfingerprinted, name) {
			fp.Fields[name] = h
		}
	}
	return fp
}
