package idempotency

import (
	"encoding/json"
	"slices"
)

// fingerprint is what a request is recognised by when its key comes again: the
// method, the path and a hash of the canonical form of each fingerprinted
// top-level body field. It is stored with the operation (StartOpts.Fingerprint).
type fingerprint struct {
	Method string            `json:"method"`
	Path   string            `json:"path"`
	Fields map[string]string `json:"fields"`
}

func newFingerprint(method, path string, hashes map[string]string, unfingerprinted []string) *fingerprint {
	fp := &fingerprint{Method: method, Path: path, Fields: make(map[string]string, len(hashes))}
	for name, h := range hashes {
		if !slices.Contains(unfingerprinted, name) {
			fp.Fields[name] = h
		}
	}
	return fp
}

func (fp *fingerprint) encode() json.RawMessage {
	raw, _ := json.Marshal(fp) // strings only: always marshals
	return raw
}

// decodeFingerprint reads a stored fingerprint. One that is absent or unreadable
// (an operation started some other way) matches no request: every field, the
// method and the path differ.
func decodeFingerprint(raw json.RawMessage) *fingerprint {
	fp := &fingerprint{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, fp); err != nil {
			fp = &fingerprint{}
		}
	}
	return fp
}

// mismatches returns, sorted, the fields whose hashes differ between fp and the
// stored fingerprint (a field present in only one of them differs) and "method"
// and "path" when those differ. Fields in unfingerprinted are ignored on both
// sides, so that a change to the list applies to operations stored before it.
func (fp *fingerprint) mismatches(stored *fingerprint, unfingerprinted []string) []string {
	var diff []string
	if fp.Method != stored.Method {
		diff = append(diff, "method")
	}
	if fp.Path != stored.Path {
		diff = append(diff, "path")
	}
	for name, h := range fp.Fields {
		if sh, ok := stored.Fields[name]; (!ok || sh != h) && !slices.Contains(unfingerprinted, name) {
			diff = append(diff, name)
		}
	}
	for name := range stored.Fields {
		if _, ok := fp.Fields[name]; !ok && !slices.Contains(unfingerprinted, name) {
			diff = append(diff, name)
		}
	}
	slices.Sort(diff)
	return slices.Compact(diff)
}
