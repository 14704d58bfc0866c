package fakeservice

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
)

// Effects returns how many requests took effect, under all keys.
func (s *Service) Effects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.made)
}

// EffectsFor returns how many requests took effect under key: 0 or 1, by
// construction.
func (s *Service) EffectsFor(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.keys[key]; e != nil && e.made {
		return 1
	}
	return 0
}

// Requests returns how many POSTs the Service received: every one, with or
// without a key, faulted, replayed or refused.
func (s *Service) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Lookups returns how many lookups (GET <LookupPrefix>/<key>) the Service
// received, faulted ones included.
func (s *Service) Lookups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

// Keys returns the keys that POSTs were received under, sorted, whether or not
// anything took effect under them.
func (s *Service) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.keys))
	for k, e := range s.keys {
		if len(e.calls) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// Calls returns the POSTs received under key, in the order they were handled
// (by Attempt), with how each was answered; nil for a key never seen.
func (s *Service) Calls(key string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.keys[key]
	if e == nil || len(e.calls) == 0 {
		return nil
	}
	calls := make([]Call, len(e.calls))
	for i, c := range e.calls {
		c.Request = c.Request.clone()
		calls[i] = c
	}
	return calls
}

// Duplicate is one body that took effect under more than one key.
type Duplicate struct {
	// Body is the body as first sent.
	Body json.RawMessage
	// Keys are the keys it took effect under, in the order of the effects: two
	// or more.
	Keys []string
	// Requests counts the POSTs with this body (equal as JSON) under any key,
	// faulted, replayed and refused ones included.
	Requests int
}

// Duplicates returns the bodies, equal as JSON, that took effect under more
// than one key, in the order of their first effects; nil when there are none.
// A client that derives its key from the operation sends one key for one
// request however often it retries, so a duplicate is either two requests that
// the test meant to make (two payments of the same amount) or a client that
// sends a fresh key on each attempt.
func (s *Service) Duplicates() []Duplicate {
	s.mu.Lock()
	defer s.mu.Unlock()
	var dups []Duplicate
	index := make(map[string]int) // canonical body -> its index in dups
	for _, m := range s.made {
		i, seen := index[m.canonical]
		if !seen {
			i = len(dups)
			index[m.canonical] = i
			dups = append(dups, Duplicate{
				Body:     append(json.RawMessage(nil), m.body...),
				Requests: s.bodies[m.canonical],
			})
		}
		dups[i].Keys = append(dups[i].Keys, m.key)
	}
	dups = slices.DeleteFunc(dups, func(d Duplicate) bool { return len(d.Keys) < 2 })
	if len(dups) == 0 {
		return nil
	}
	return dups
}

// canonicalJSON returns the canonical form of the JSON value b: object members
// sorted by name, no white space, numbers as written. It fails when b is not
// one JSON value.
func canonicalJSON(b []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", errors.New("more than one JSON value")
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n"))), nil
}

// checkJSON fails when b is not one JSON value.
func checkJSON(b []byte) error {
	_, err := canonicalJSON(b)
	return err
}
