package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxEventIDLen is the longest event id accepted, in bytes. An event id is the
// operation's idempotency key.
const MaxEventIDLen = 255

// ErrIgnore is what a Config.EventFunc returns for an event that the service
// does not act on (a type it does not handle): the handler answers 200
// {"received": true, "ignored": true} and records nothing.
var ErrIgnore = errors.New("webhook: event ignored")

// Event identifies a delivered event.
type Event struct {
	// ID is the provider's id of the event, the same on every delivery of it:
	// the key of its operation. Required.
	ID string
	// Type is the provider's type of the event ("payment.succeeded"), for logs.
	// Optional.
	Type string
}

// ParseEvent reads the id and the type of an event whose body is a JSON object
// with a string member "id" (required, not empty) and a string member "type"
// (optional), as Stripe's and most providers' events are. The other members are
// not looked at. Its errors say what is wrong in the body's terms, for the
// sender.
func ParseEvent(body []byte) (Event, error) {
	if !json.Valid(body) {
		return Event{}, errors.New("the body is not JSON")
	}
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' {
		return Event{}, errors.New("the body is not a JSON object")
	}
	var members struct {
		ID   json.RawMessage `json:"id"`
		Type json.RawMessage `json:"type"`
	}
	if err := json.Unmarshal(body, &members); err != nil {
		return Event{}, errors.New("the body is not a JSON object")
	}
	var ev Event
	if err := stringMember(members.ID, &ev.ID); err != nil || ev.ID == "" {
		if err == nil {
			err = errors.New("the event has no id")
		}
		return Event{}, err
	}
	if err := stringMember(members.Type, &ev.Type); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// stringMember decodes the member raw, a JSON string or null or absent, into
// dst.
func stringMember(raw json.RawMessage, dst *string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] != '"' || json.Unmarshal(raw, dst) != nil {
		return errors.New("the event's id and type must be strings")
	}
	return nil
}

// decodeError words an error of encoding/json for the sender, without Go's
// names.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return fmt.Errorf("the event's member %s has the wrong type", typeErr.Field)
	}
	return errors.New("the event does not decode into the operation's input")
}

// checkID returns an error when id cannot be an event's key: empty, longer
// than MaxEventIDLen, not UTF-8, or with control characters (PostgreSQL's text
// takes no NUL).
func checkID(id string) error {
	return checkText(id, "the event has no id", "the event id")
}

// checkKey returns an error when key cannot be the derived key that an
// outcome names, by checkID's rules.
func checkKey(key string) error {
	return checkText(key, "the event names no key", "the key it names")
}

// checkText returns none when s is empty, else an error naming s as what
// when s is longer than MaxEventIDLen, not UTF-8, or has a control character.
func checkText(s, none, what string) error {
	switch {
	case s == "":
		return errors.New(none)
	case len(s) > MaxEventIDLen:
		return fmt.Errorf("%s is longer than %d bytes", what, MaxEventIDLen)
	case !utf8.ValidString(s):
		return errors.New(what + " is not UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return errors.New(what + " has a control character")
		}
	}
	return nil
}
