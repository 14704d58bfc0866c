package idempotency

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/internal/fieldhash"
)

// parsedBody is a request body that is a JSON object without duplicate keys: its
// top-level fields as sent, and the hash of each field's canonical form.
type parsedBody struct {
	fields Fields
	hashes map[string]string
}

// parseBody checks that data is one JSON object whose objects, at every depth,
// have no duplicate keys, and returns its top-level fields. A problem with one
// field is a *FieldError naming it.
func parseBody(data []byte) (*parsedBody, error) {
	if b, ok := parseBodyFast(data); ok {
		return b, nil
	}
	return parseBodyTokens(data)
}

// parseBodyTokens is parseBody with encoding/json's decoder, token by token:
// for every body, with the error of one that is not a JSON object without
// duplicate keys.
func parseBodyTokens(data []byte) (*parsedBody, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("the request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, errNotJSON(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("the request body must be a JSON object")
	}
	b := &parsedBody{fields: Fields{}, hashes: map[string]string{}}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, errNotJSON(err)
		}
		name := tok.(string) // Token returns object keys as strings
		if _, dup := b.fields[name]; dup {
			return nil, &FieldError{Param: name, Message: "the field appears more than once"}
		}
		start := dec.InputOffset()
		var canon bytes.Buffer
		if err := canonicalValue(dec, &canon, name, 1); err != nil {
			return nil, err
		}
		// The value starts after the key's colon.
		raw := bytes.TrimSpace(data[start:dec.InputOffset()])
		raw = bytes.TrimSpace(bytes.TrimPrefix(raw, []byte(":")))
		b.fields[name] = json.RawMessage(raw)
		b.hashes[name] = fieldhash.Of(canon.Bytes())
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, errNotJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the request body is not valid JSON: data after the object")
	}
	return b, nil
}

func errNotJSON(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the request body is not valid JSON: unexpected end")
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return errors.New("the request body is not valid JSON: " + strings.TrimPrefix(se.Error(), "json: "))
	}
	return errors.New("the request body is not valid JSON")
}

// canonicalJSON returns the canonical form (see canonicalValue) of the JSON value
// data.
func canonicalJSON(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var canon bytes.Buffer
	if err := canonicalValue(dec, &canon, "", 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return canon.Bytes(), nil
}

// MaxDepth bounds how deeply the arrays and objects of a request body may nest,
// the body itself counting as the first level; a deeper body answers 400
// invalid_request.
const MaxDepth = 32

// canonicalValue reads the next JSON value from dec and writes its canonical form
// to w: object members sorted by key, no white space, strings as encoding/json
// writes them, and numbers in a form that depends on their value alone (see
// canonicalNumber). Two values are equal as JSON values exactly when their
// canonical forms are equal. dec must use json.Number (UseNumber); path names
// the value in errors; depth counts the arrays and objects around it.
func canonicalValue(dec *json.Decoder, w *bytes.Buffer, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return errNotJSON(err)
	}
	switch v := tok.(type) {
	case json.Delim:
		// The bound keeps a hostile body's cost linear: every level holds its own
		// path and buffer while the levels below it are read.
		if depth >= MaxDepth {
			return &FieldError{Param: path, Message: fmt.Sprintf("the value is nested more than %d levels deep", MaxDepth)}
		}
		if v == '[' {
			w.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					w.WriteByte(',')
				}
				if err := canonicalValue(dec, w, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
					return err
				}
			}
			w.WriteByte(']')
		} else {
			members := map[string][]byte{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return errNotJSON(err)
				}
				key := tok.(string)
				if _, dup := members[key]; dup {
					return &FieldError{Param: path + "." + key, Message: "the field appears more than once"}
				}
				var member bytes.Buffer
				if err := canonicalValue(dec, &member, path+"."+key, depth+1); err != nil {
					return err
				}
				members[key] = member.Bytes()
			}
			w.WriteByte('{')
			for i, key := range slices.Sorted(maps.Keys(members)) {
				if i > 0 {
					w.WriteByte(',')
				}
				writeString(w, key)
				w.WriteByte(':')
				w.Write(members[key])
			}
			w.WriteByte('}')
		}
		if _, err := dec.Token(); err != nil { // the closing bracket or brace
			return errNotJSON(err)
		}
	case string:
		writeString(w, v)
	case json.Number:
		w.WriteString(canonicalNumber(string(v)))
	case bool:
		w.WriteString(strconv.FormatBool(v))
	case nil:
		w.WriteString("null")
	}
	return nil
}

func writeString(w *bytes.Buffer, s string) {
	raw, _ := json.Marshal(s) // a string always marshals
	w.Write(raw)
}

// canonicalNumber returns the canonical form of the JSON number n, which must be
// valid JSON: the shortest of the forms that ECMAScript's Number.prototype.toString
// would choose, but exact (1, 1.0, 1e0 and 10e-1 all give "1"; 100 gives "100",
// 1e21 gives "1e21", 0.000001 gives "0.000001", 1e-7 gives "1e-7"), with no limit
// on precision or range. -0 is 0.
func canonicalNumber(n string) string {
	neg := strings.HasPrefix(n, "-")
	n = strings.TrimPrefix(n, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(n), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	// The value is digits × 10^exp, with exp = the written exponent − len(frac)
	// + the trailing zeros dropped.
	exp := new(big.Int)
	if expText != "" {
		exp.SetString(strings.TrimPrefix(expText, "+"), 10) // valid JSON: always parses
	}
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed)-len(frac))))
	digits = trimmed

	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	// point is where the decimal point falls, counted in digits from the left.
	point := new(big.Int).Add(exp, big.NewInt(int64(len(digits))))
	const maxPlain = 21
	if point.IsInt64() && point.Int64() >= -5 && point.Int64() <= maxPlain {
		p := int(point.Int64())
		switch {
		case p >= len(digits): // an integer
			b.WriteString(digits)
			b.WriteString(strings.Repeat("0", p-len(digits)))
		case p > 0:
			b.WriteString(digits[:p])
			b.WriteByte('.')
			b.WriteString(digits[p:])
		default:
			b.WriteString("0.")
			b.WriteString(strings.Repeat("0", -p))
			b.WriteString(digits)
		}
		return b.String()
	}
	b.WriteString(digits[:1])
	if len(digits) > 1 {
		b.WriteByte('.')
		b.WriteString(digits[1:])
	}
	b.WriteByte('e')
	b.WriteString(point.Sub(point, big.NewInt(1)).String())
	return b.String()
}
