package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Fields are the top-level fields of a request body, by name, each as sent. The
// body they come from is a JSON object with no duplicate keys at any depth. A
// DecodeFunc builds an operation's input from them; the methods below make that
// short and answer with the *FieldError that names the field.
type Fields map[string]json.RawMessage

// Required decodes the field name into dst, which must be a pointer. It returns a
// *FieldError when the field is absent or null, or does not decode into dst
// (unknown fields of nested objects included).
func (f Fields) Required(name string, dst any) error {
	if raw, ok := f[name]; !ok || string(raw) == "null" {
		return &FieldError{Param: name, Message: "the field is required"}
	}
	return f.Optional(name, dst)
}

// Optional is Required for a field that may be absent or null: then dst is left
// as it is.
func (f Fields) Optional(name string, dst any) error {
	raw, ok := f[name]
	if !ok || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return fieldDecodeError(name, err)
	}
	return nil
}

// Only returns a *FieldError naming the first field, in key order, that is not
// one of names.
func (f Fields) Only(names ...string) error {
	var unknown []string
	for name := range f {
		if !slices.Contains(names, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	return &FieldError{Param: unknown[0], Message: "unknown field"}
}

func fieldDecodeError(name string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		param := name
		if te.Field != "" {
			param += "." + te.Field
		}
		return &FieldError{Param: param, Message: fmt.Sprintf("expected %s, got %s", describeType(te.Type), te.Value)}
	}
	return &FieldError{Param: name, Message: strings.TrimPrefix(err.Error(), "json: ")}
}

// describeType names a Go type the way a JSON client would read it.
func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another type"
}
