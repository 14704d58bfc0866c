package engine

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"unicode"
)

var (
	jsonMarshalerType   = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textMarshalerType   = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkJSONType reports why values of t would not survive a round trip through
// encoding/json (Marshal, then Unmarshal into a fresh value), naming the field,
// or nil when they would. The engine keeps an operation's input, state and
// result as JSON and decodes them on every resume, so a field that encoding/json
// drops or cannot decode would be zero on a retry.
//
// The error reads "field <path>: <reason>", the path running from t in Go's
// terms (Payee.account, Items[].Note, Tags[key]; a pointer adds nothing), or
// "the type itself: <reason>" when t is the problem. It is the first problem
// in declaration order, so the answer does not change from run to run.
//
// A type that implements both json.Marshaler and json.Unmarshaler, or both
// encoding.TextMarshaler and encoding.TextUnmarshaler (the unmarshaler with a
// pointer receiver, the marshaler with either), is trusted as it is and not
// looked into: time.Time, json.RawMessage, uuid.UUID, big.Int. Otherwise a
// struct field tagged `json:"-"` is skipped as the author's choice, and t is
// refused if it holds a func, a channel, a complex number, an unsafe.Pointer,
// a non-empty interface, a map whose keys are neither strings, integers nor
// text marshalers, an unexported field, or an embedded pointer to an
// unexported struct. An embedded unexported struct is looked into, since
// encoding/json promotes its exported fields; an embedded unexported type of
// another kind is refused like an unexported field, since encoding/json skips
// it.
//
// What it does not see: values (a NaN or an infinity, which Marshal refuses),
// what a custom marshaler does with its own data, a marshaler with a pointer
// receiver reached where encoding/json has no address (a map value, or t
// itself when marshaled by value), and fields that encoding/json drops by
// name: an embedded struct's field hidden by an outer one with the same JSON
// name, two at the same depth cancelling out, or all the other fields of a
// struct whose MarshalJSON is promoted from an embedded time.Time.
func checkJSONType(t reflect.Type) error {
	c := jsonTypeChecker{visited: make(map[jsonTypeVisit]bool)}
	return c.check(t, "")
}

// jsonTypeVisit keys a type already looked at, as a value (fields false) or
// as an embedded struct whose fields encoding/json promotes (fields true):
// the second ignores the type's own marshaler, the first honours it.
type jsonTypeVisit struct {
	t      reflect.Type
	fields bool
}

type jsonTypeChecker struct {
	// visited ends the walk of recursive types. A type seen before is either
	// being walked further up (its problems are found there) or was walked and
	// found sound, since the walk stops at the first problem.
	visited map[jsonTypeVisit]bool
}

func (c *jsonTypeChecker) check(t reflect.Type, path string) error {
	visit := jsonTypeVisit{t: t}
	if c.visited[visit] {
		return nil
	}
	c.visited[visit] = true

	if marshalsItself(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Func:
		return jsonTypeError(path, "is a func")
	case reflect.Chan:
		return jsonTypeError(path, "is a channel")
	case reflect.Complex64, reflect.Complex128:
		return jsonTypeError(path, "is a complex number")
	case reflect.UnsafePointer:
		return jsonTypeError(path, "is an unsafe.Pointer")
	case reflect.Interface:
		if t.NumMethod() > 0 {
			return jsonTypeError(path, "is a non-empty interface "+t.String()+
				" (encoding/json cannot decode into it)")
		}
		return nil
	case reflect.Pointer:
		return c.check(t.Elem(), path)
	case reflect.Slice, reflect.Array:
		return c.check(t.Elem(), path+"[]")
	case reflect.Map:
		if !validMapKey(t.Key()) {
			return jsonTypeError(path, "is a map with keys of type "+t.Key().String()+
				" (encoding/json needs string, integer or encoding.TextMarshaler keys)")
		}
		return c.check(t.Elem(), path+"[key]")
	case reflect.Struct:
		return c.checkFields(t, path)
	default:
		return nil
	}
}

// checkFields walks the fields of struct type t the way encoding/json's
// typeFields picks them.
func (c *jsonTypeChecker) checkFields(t reflect.Type, path string) error {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		fpath := f.Name
		if path != "" {
			fpath = path + "." + f.Name
		}

		if f.Anonymous {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case !f.IsExported() && ft.Kind() != reflect.Struct:
				// encoding/json ignores it, so its value is lost like that of
				// any unexported field.
				return jsonTypeError(fpath, "is unexported (encoding/json skips it)")
			case !f.IsExported() && f.Type.Kind() == reflect.Pointer:
				// Decoding fails when the pointer is nil, as it is in a fresh
				// value; with a tag naming the field, it panics.
				return jsonTypeError(path, "embeds a pointer to the unexported struct "+
					ft.String()+" (encoding/json cannot set it)")
			case !f.IsExported() && name != "" && hasMarshalMethod(ft):
				// encoding/json nests it under the name, then panics calling
				// a method through an unexported field.
				return jsonTypeError(fpath, "is an unexported embedded "+ft.String()+
					" given a JSON name (encoding/json cannot call its marshaling methods)")
			case !f.IsExported() || name == "" && ft.Kind() == reflect.Struct:
				// encoding/json promotes the struct's exported fields into t's
				// object (or, for an unexported one tagged with a name, nests
				// them) and ignores the struct's own marshaler.
				visit := jsonTypeVisit{t: ft, fields: true}
				if c.visited[visit] {
					continue
				}
				c.visited[visit] = true
				if err := c.checkFields(ft, fpath); err != nil {
					return err
				}
				continue
			}
			// Otherwise encoding/json treats it as a field named after its type
			// or its tag.
		} else if !f.IsExported() {
			return jsonTypeError(fpath, "is unexported (encoding/json skips it)")
		}

		if err := c.check(f.Type, fpath); err != nil {
			return err
		}
	}
	return nil
}

// marshalsItself reports whether encoding/json hands values of t to their own
// methods both ways: MarshalJSON and UnmarshalJSON, or MarshalText and
// UnmarshalText. Decoding always goes through a pointer, so the unmarshaler
// may have a pointer receiver; so may the marshaler.
func marshalsItself(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	if (t.Implements(jsonMarshalerType) || pt.Implements(jsonMarshalerType)) &&
		pt.Implements(jsonUnmarshalerType) {
		return true
	}
	return (t.Implements(textMarshalerType) || pt.Implements(textMarshalerType)) &&
		pt.Implements(textUnmarshalerType)
}

// hasMarshalMethod reports whether t or *t has any of the methods through
// which encoding/json hands a value to its type.
func hasMarshalMethod(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	for _, m := range [...]reflect.Type{jsonMarshalerType, jsonUnmarshalerType, textMarshalerType, textUnmarshalerType} {
		if pt.Implements(m) {
			return true
		}
	}
	return false
}

// validMapKey reports whether encoding/json both encodes and decodes map keys
// of type k. Map keys are not addressable, so a text marshaler must have a
// value receiver.
func validMapKey(k reflect.Type) bool {
	switch k.Kind() {
	case reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return true
	}
	return k.Implements(textMarshalerType) && reflect.PointerTo(k).Implements(textUnmarshalerType)
}

func jsonTypeError(path, reason string) error {
	if path == "" {
		return errors.New("the type itself: " + reason)
	}
	return errors.New("field " + path + ": " + reason)
}

// valueOnlyJSON reports whether every value of t whose strings are valid UTF-8
// comes back from a round trip through encoding/json (Marshal, then Unmarshal
// into a fresh value) equal to what it was, with nothing shared: t is made of
// booleans, numbers, strings, arrays of them and structs of them, without a
// method of encoding/json's or encoding's, and every struct field encoding/json
// writes, under its own name. A run copies such a state after a step instead
// of decoding it back from its checkpoint: the copy is what the decode would
// give. Pointers, slices, maps and interfaces are left out: two fields may
// share what they point to, which a decoded value does not. So are
// fields that encoding/json names otherwise than their tag says (an invalid
// tag name), and floats that it may leave out (omitempty, omitzero), since a
// -0 comes back as 0.
func valueOnlyJSON(t reflect.Type) bool {
	if hasMarshalMethod(t) {
		return false
	}
	switch t.Kind() {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return true
	case reflect.Array:
		return valueOnlyJSON(t.Elem())
	case reflect.Struct:
		names := make(map[string]bool, t.NumField())
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, opts, _ := strings.Cut(tag, ",")
			omits := hasOption(opts, "omitempty") || hasOption(opts, "omitzero")
			switch {
			case f.Anonymous, !f.IsExported(), tag == "-", hasOption(opts, "string"):
				return false
			case name != "" && !validTagName(name):
				// encoding/json names it by the Go field instead, which may
				// be another field's name.
				return false
			case hasOption(opts, "omitzero") && hasIsZero(f.Type):
				// Its IsZero, not the value, decides whether it is written.
				return false
			case omits && holdsFloat(f.Type):
				// A -0 counts as empty, and comes back as 0.
				return false
			case name == "":
				name = f.Name
			}
			// encoding/json matches names without regard to case when it decodes.
			folded := strings.ToLower(name)
			if names[folded] || !valueOnlyJSON(f.Type) {
				return false
			}
			names[folded] = true
		}
		return true
	default:
		return false
	}
}

// validTagName reports whether encoding/json takes name, from a struct tag, as
// the field's JSON name: letters, digits, spaces and the punctuation it allows
// (not quotes or backslashes). It names the field by its Go name otherwise.
func validTagName(name string) bool {
	for _, c := range name {
		if !unicode.IsLetter(c) && !unicode.IsDigit(c) && !strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c) {
			return false
		}
	}
	return true
}

// holdsFloat reports whether values of t, made of values only, hold a float.
func holdsFloat(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return true
	case reflect.Array:
		return holdsFloat(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsFloat(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

func hasOption(opts, name string) bool {
	for o := range strings.SplitSeq(opts, ",") {
		if o == name {
			return true
		}
	}
	return false
}

func hasIsZero(t reflect.Type) bool {
	_, ok := reflect.PointerTo(t).MethodByName("IsZero")
	return ok
}

// replacedUTF8 reports whether raw, which encoding/json wrote, may hold a
// string in which it replaced invalid UTF-8 (by \ufffd): decoding it gives
// another string. A string that holds the text \ufffd answers true too.
func replacedUTF8(raw []byte) bool {
	return bytes.Contains(raw, []byte(`\ufffd`))
}
