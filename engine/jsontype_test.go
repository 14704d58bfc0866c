package engine

import (
	"encoding/json"
	"fmt"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// jtMoney keeps its data in unexported fields and marshals itself.
type jtMoney struct {
	cents    int64
	currency string
}

type jtMoneyJSON struct {
	Cents    int64
	Currency string
}

func (m jtMoney) MarshalJSON() ([]byte, error) {
	return json.Marshal(jtMoneyJSON{Cents: m.cents, Currency: m.currency})
}

func (m *jtMoney) UnmarshalJSON(b []byte) error {
	var j jtMoneyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = jtMoney{cents: j.Cents, currency: j.Currency}
	return nil
}

// jtMarshalOnly marshals itself but has no way back.
type jtMarshalOnly struct{ secret string }

func (m jtMarshalOnly) MarshalJSON() ([]byte, error) { return json.Marshal(m.secret) }

// jtTextKey is a map key through its text methods.
type jtTextKey struct{ Region, Code string }

func (k jtTextKey) MarshalText() ([]byte, error) { return []byte(k.Region + "/" + k.Code), nil }

func (k *jtTextKey) UnmarshalText(b []byte) error {
	var ok bool
	if k.Region, k.Code, ok = strings.Cut(string(b), "/"); !ok {
		return fmt.Errorf("jtTextKey %q: no slash", b)
	}
	return nil
}

// jtPtrTextKey has text methods on the pointer only, which encoding/json
// cannot call on a map key.
type jtPtrTextKey struct{ ID int }

func (k *jtPtrTextKey) MarshalText() ([]byte, error) { return fmt.Appendf(nil, "%d", k.ID), nil }

func (k *jtPtrTextKey) UnmarshalText(b []byte) error {
	_, err := fmt.Sscanf(string(b), "%d", &k.ID)
	return err
}

// jtTree and jtForest refer to each other.
type jtTree struct {
	Name   string
	Forest *jtForest
}

type jtForest struct{ Trees []jtTree }

type jtTypeCase struct {
	name string
	typ  reflect.Type
	// value, for an accepted type, is a filled value that must round trip.
	value any
	// want is the error text, empty when the type is accepted.
	want string
}

func jtTypeCases() []jtTypeCase {
	type Payee struct {
		Name    string
		Account string
	}
	type Item struct {
		SKU   string
		Count int
	}
	type kind string
	type node struct {
		Value int
		Next  *node
		Kids  []node
	}
	type Chain struct {
		*Chain
		N int
	}
	type base struct {
		ID string
		At time.Time
	}
	type Base struct{ Region string }
	type Extra struct{ Note string }
	type count int
	type point struct{ X, Y int }
	type payee struct {
		Name string
		//lint:ignore U1000 the unexported field is what the check must find
		account string
	}
	type hidden struct {
		Name string
		//lint:ignore U1000 the unexported field is what the check must find
		secret string
	}
	type Hook func()
	type badNode struct {
		Name string
		Kids []badNode
		Meta map[string]chan int
	}

	n := 7
	s := "s"
	ps := &s
	at := time.Date(2026, 3, 1, 12, 30, 0, 0, time.UTC)
	id := uuid.MustParse("0b4c6f3e-8a9d-4f7b-9c1e-2d3a4b5c6d7e")
	const mapKeys = " (encoding/json needs string, integer or encoding.TextMarshaler keys)"

	return []jtTypeCase{
		// Accepted.
		{
			name: "scalars",
			value: struct {
				S   string
				I   int
				I8  int8
				U   uint64
				F   float64
				B   bool
				D   time.Duration
				K   kind
				Ptr uintptr
			}{"a", -1, 8, 1 << 60, 1.5, true, time.Second, "k", 3},
		},
		{name: "empty struct", value: struct{}{}},
		{
			name: "nested struct",
			value: struct {
				Payee  Payee
				Amount int
			}{Payee{"Ada", "FR76"}, 100},
		},
		{name: "pointer to a struct", value: &Payee{"Ada", "FR76"}},
		{
			name: "pointers",
			value: struct {
				P  *int
				PP **string
				S  *Payee
				N  *Payee
			}{P: &n, PP: &ps, S: &Payee{Name: "Ada"}},
		},
		{
			name: "slices and arrays",
			value: struct {
				Items  []Item
				Fixed  [3]int
				Matrix [][]float64
				Ptrs   []*Item
			}{[]Item{{"a", 1}}, [3]int{1, 2, 3}, [][]float64{{1}, {2, 3}}, []*Item{{"b", 2}}},
		},
		{name: "bytes", value: struct{ Raw []byte }{[]byte{0, 0xff, 'a'}}},
		{name: "json.RawMessage", value: json.RawMessage(`{"a":1}`)},
		{name: "json.RawMessage field", value: struct{ Doc json.RawMessage }{json.RawMessage(`[1,"x"]`)}},
		{
			name: "maps with string and integer keys",
			value: struct {
				ByName map[string]int
				ByID   map[int64]Item
				ByCode map[uint8]string
				ByKind map[kind][]*Item
			}{
				map[string]int{"a": 1},
				map[int64]Item{-3: {"x", 1}},
				map[uint8]string{200: "y"},
				map[kind][]*Item{"k": {{"z", 2}}},
			},
		},
		{name: "map with text marshaler keys", value: map[jtTextKey]int{{"FR", "75"}: 1}},
		{name: "map with uuid keys", value: map[uuid.UUID]string{id: "x"}},
		{
			name: "time.Time",
			value: struct {
				At    time.Time
				Maybe *time.Time
			}{at, &at},
		},
		{
			name: "uuid and big.Int",
			value: struct {
				ID  uuid.UUID
				Big *big.Int
			}{id, new(big.Int).Lsh(big.NewInt(3), 100)},
		},
		{
			name: "empty interface",
			value: struct {
				Any  any
				List []any
				Doc  map[string]any
			}{"x", []any{1.5, "a"}, map[string]any{"k": true}},
		},
		{name: "recursive type", value: node{Value: 1, Next: &node{Value: 2}, Kids: []node{{Value: 3}}}},
		{name: "mutually recursive types", value: jtTree{Name: "oak", Forest: &jtForest{Trees: []jtTree{{Name: "elm"}}}}},
		{name: "embedded pointer to itself", value: Chain{N: 1}},
		{
			name: "embedded unexported struct with exported fields",
			value: struct {
				base
				Note string
			}{base{"b1", at}, "n"},
		},
		{
			name: "embedded unexported struct tagged with a name",
			value: struct {
				base `json:"base"`
				N    int
			}{base{"b1", at}, 2},
		},
		{
			name: "embedded exported struct and pointer",
			value: struct {
				Base
				*Extra
				N int
			}{Base{"eu"}, &Extra{"x"}, 3},
		},
		{
			name: `fields tagged json:"-"`,
			value: struct {
				Name   string
				secret string   `json:"-"`
				OnDone func()   `json:"-"`
				Ch     chan int `json:"-"`
				Err    error    `json:"-"`
				count  `json:"-"`
				*payee `json:"-"`
			}{Name: "kept"},
		},
		{name: "custom marshaler with unexported fields", value: jtMoney{cents: 1250, currency: "EUR"}},
		{
			name: "custom marshaler fields",
			value: struct {
				Price  jtMoney
				Prices []jtMoney
				ByName map[string]*jtMoney
			}{jtMoney{1, "EUR"}, []jtMoney{{2, "USD"}}, map[string]*jtMoney{"a": {3, "GBP"}}},
		},

		// Refused.
		{name: "func", typ: reflect.TypeFor[func()](), want: "the type itself: is a func"},
		{name: "channel", typ: reflect.TypeFor[chan int](), want: "the type itself: is a channel"},
		{name: "pointer to a func", typ: reflect.TypeFor[*func()](), want: "the type itself: is a func"},
		{
			name: "func field",
			typ: reflect.TypeFor[struct {
				Name   string
				OnDone func(error)
			}](),
			want: "field OnDone: is a func",
		},
		{
			name: "nested channel field",
			typ:  reflect.TypeFor[struct{ Worker struct{ Jobs <-chan int } }](),
			want: "field Worker.Jobs: is a channel",
		},
		{name: "array of channels", typ: reflect.TypeFor[struct{ Lanes [2]chan int }](), want: "field Lanes[]: is a channel"},
		{name: "complex64", typ: reflect.TypeFor[struct{ Z complex64 }](), want: "field Z: is a complex number"},
		{name: "slice of complex128", typ: reflect.TypeFor[struct{ Roots []complex128 }](), want: "field Roots[]: is a complex number"},
		{name: "unsafe.Pointer", typ: reflect.TypeFor[struct{ Ptr unsafe.Pointer }](), want: "field Ptr: is an unsafe.Pointer"},
		{
			name: "unexported field",
			typ:  reflect.TypeFor[struct{ Payee payee }](),
			want: "field Payee.account: is unexported (encoding/json skips it)",
		},
		{
			name: "unexported field deep down",
			typ: reflect.TypeFor[struct {
				Outer struct {
					Inner []struct {
						Note   string
						secret int
					}
				}
			}](),
			want: "field Outer.Inner[].secret: is unexported (encoding/json skips it)",
		},
		{name: "map of funcs", typ: reflect.TypeFor[struct{ Tags map[string]func() }](), want: "field Tags[key]: is a func"},
		{
			name: "map value with unexported field",
			typ:  reflect.TypeFor[map[string][]*payee](),
			want: "field [key][].account: is unexported (encoding/json skips it)",
		},
		{
			name: "map with float keys",
			typ:  reflect.TypeFor[struct{ Weights map[float64]string }](),
			want: "field Weights: is a map with keys of type float64" + mapKeys,
		},
		{
			name: "map with struct keys",
			typ:  reflect.TypeFor[map[point]int](),
			want: "the type itself: is a map with keys of type engine.point" + mapKeys,
		},
		{
			name: "map with bool keys",
			typ:  reflect.TypeFor[struct{ Seen map[bool]int }](),
			want: "field Seen: is a map with keys of type bool" + mapKeys,
		},
		{
			name: "map with pointer-receiver text keys",
			typ:  reflect.TypeFor[struct{ ByKey map[jtPtrTextKey]int }](),
			want: "field ByKey: is a map with keys of type engine.jtPtrTextKey" + mapKeys,
		},
		{
			name: "non-empty interface",
			typ:  reflect.TypeFor[struct{ Label fmt.Stringer }](),
			want: "field Label: is a non-empty interface fmt.Stringer (encoding/json cannot decode into it)",
		},
		{
			name: "error field",
			typ:  reflect.TypeFor[struct{ Err error }](),
			want: "field Err: is a non-empty interface error (encoding/json cannot decode into it)",
		},
		{
			name: "embedded pointer to unexported struct",
			typ: reflect.TypeFor[struct {
				*base
				N int
			}](),
			want: "the type itself: embeds a pointer to the unexported struct engine.base (encoding/json cannot set it)",
		},
		{
			name: "nested embedded pointer to unexported struct",
			typ:  reflect.TypeFor[struct{ Payee struct{ *base } }](),
			want: "field Payee: embeds a pointer to the unexported struct engine.base (encoding/json cannot set it)",
		},
		{
			name: "embedded pointer to unexported struct tagged with a name",
			typ: reflect.TypeFor[struct {
				*base `json:"base"`
			}](),
			want: "the type itself: embeds a pointer to the unexported struct engine.base (encoding/json cannot set it)",
		},
		{
			name: "unexported field in embedded unexported struct",
			typ:  reflect.TypeFor[struct{ hidden }](),
			want: "field hidden.secret: is unexported (encoding/json skips it)",
		},
		{
			name: "embedded unexported non-struct",
			typ: reflect.TypeFor[struct {
				count
				N int
			}](),
			want: "field count: is unexported (encoding/json skips it)",
		},
		{
			name: "embedded pointer to unexported non-struct",
			typ:  reflect.TypeFor[struct{ *count }](),
			want: "field count: is unexported (encoding/json skips it)",
		},
		{name: "embedded exported func type", typ: reflect.TypeFor[struct{ Hook }](), want: "field Hook: is a func"},
		{
			name: "first problem in declaration order",
			typ: reflect.TypeFor[struct {
				A int
				B func()
				C chan int
				d string
			}](),
			want: "field B: is a func",
		},
		{name: "recursive type with a problem", typ: reflect.TypeFor[badNode](), want: "field Meta[key]: is a channel"},
		{
			name: "marshaler without unmarshaler is looked into",
			typ:  reflect.TypeFor[struct{ Secret jtMarshalOnly }](),
			want: "field Secret.secret: is unexported (encoding/json skips it)",
		},
		{
			// MarshalJSON of Time and RawMessage, MarshalText of Time and
			// jtTextKey cancel out: encoding/json promotes Time's fields.
			name: "embedded marshalers cancelling out",
			typ: reflect.TypeFor[struct {
				time.Time
				json.RawMessage
				jtTextKey
			}](),
			want: "field Time.wall: is unexported (encoding/json skips it)",
		},
		{
			name: "unexported embedded marshaler given a JSON name",
			typ: reflect.TypeFor[struct {
				jtMoney `json:"money"`
				json.RawMessage
			}](),
			want: "field jtMoney: is an unexported embedded engine.jtMoney given a JSON name" +
				" (encoding/json cannot call its marshaling methods)",
		},
	}
}

func TestCheckJSONType(t *testing.T) {
	t.Parallel()
	for _, tt := range jtTypeCases() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			typ := tt.typ
			if typ == nil {
				typ = reflect.TypeOf(tt.value)
			}
			err := checkJSONType(typ)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.EqualError(t, err, tt.want)
		})
	}
}

// TestCheckJSONTypeRoundTrip checks that the accepted cases' values come back
// equal from Marshal and Unmarshal into a fresh value.
func TestCheckJSONTypeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tt := range jtTypeCases() {
		if tt.value == nil {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, err := json.Marshal(tt.value)
			require.NoError(t, err)
			got := reflect.New(reflect.TypeOf(tt.value))
			require.NoError(t, json.Unmarshal(b, got.Interface()), "json: %s", b)
			require.Equal(t, tt.value, got.Elem().Interface(), "json: %s", b)
		})
	}
}

// jtZeroed reports itself zero whatever it holds.
type jtZeroed struct{ N int }

func (jtZeroed) IsZero() bool { return true }

func TestValueOnlyJSON(t *testing.T) {
	t.Parallel()
	type kind string
	type Money struct {
		Cents    int64
		Currency string `json:"currency,omitempty"`
	}
	type State struct {
		ID     string `json:"id"`
		Kind   kind   `json:"kind"`
		Done   bool   `json:"done,omitempty"`
		Total  Money  `json:"total"`
		Splits [2]Money
		Ratio  float64
		Small  float32
		//lint:ignore SA5008 a field named "-", which the check must tell from one tagged "-"
		Dash  string `json:"-,"`
		Later uint8  `json:"later,omitzero"`
	}
	type Base struct{ Region string }
	type withPointer struct{ P *string }
	type withSlice struct{ S []string }
	type withMap struct{ M map[string]int }
	type withAny struct{ V any }
	type withTime struct{ At time.Time }
	type withRaw struct{ R json.RawMessage }
	type embedded struct {
		Base
		N int
	}
	type unexported struct {
		N int
		//lint:ignore U1000 the unexported field is what the check must find
		n int
	}
	type skipped struct {
		N    int
		Memo string `json:"-"`
	}
	type quoted struct {
		N int `json:",string"`
	}
	type sameName struct {
		A int `json:"name"`
		B int `json:"Name"`
	}
	type isZero struct {
		Z jtZeroed `json:"z,omitzero"`
	}
	// An invalid tag name is dropped: encoding/json names the field B, as A's
	// tag does, and writes only A.
	type invalidTag struct {
		A int `json:"B"`
		//lint:ignore SA5008 the invalid tag name is what the check must find
		B int `json:"x'"`
	}
	type punctuated struct {
		A int `json:"a-b.c"`
		B int `json:"a b"`
	}
	type omittedFloat struct {
		F float64 `json:"f,omitempty"`
	}
	type omittedZeroFloat struct {
		M struct{ F float32 } `json:"m,omitzero"`
	}
	type omittedInt struct {
		N int `json:"n,omitempty"`
	}
	tests := []struct {
		name  string
		typ   reflect.Type
		value any // for a value-only type: a filled value that must come back equal
		want  bool
	}{
		{"string", reflect.TypeFor[string](), "süß <&> \u2028 \"q\" \\ \n", true},
		{"int64", reflect.TypeFor[int64](), int64(-1 << 62), true},
		{"named string", reflect.TypeFor[kind](), kind("refund"), true},
		{"a struct of values", reflect.TypeFor[State](), State{
			ID: "r_1", Kind: "k", Done: true, Total: Money{Cents: 5, Currency: "EUR"},
			Splits: [2]Money{{Cents: 1}, {Cents: 4, Currency: "EUR"}},
			Ratio:  0.1 + 0.2, Small: 1.1, Dash: "d", Later: 3,
		}, true},
		{"a struct of zero values", reflect.TypeFor[State](), State{}, true},
		{"an array", reflect.TypeFor[[3]int](), [3]int{1, -2, 3}, true},
		{"a pointer", reflect.TypeFor[withPointer](), nil, false},
		{"a slice", reflect.TypeFor[withSlice](), nil, false},
		{"a map", reflect.TypeFor[withMap](), nil, false},
		{"an interface", reflect.TypeFor[withAny](), nil, false},
		{"time.Time", reflect.TypeFor[withTime](), nil, false},
		{"json.RawMessage", reflect.TypeFor[withRaw](), nil, false},
		{"an embedded struct", reflect.TypeFor[embedded](), nil, false},
		{"an unexported field", reflect.TypeFor[unexported](), nil, false},
		{`a field tagged "-"`, reflect.TypeFor[skipped](), nil, false},
		{"a string option", reflect.TypeFor[quoted](), nil, false},
		{"names equal but for case", reflect.TypeFor[sameName](), nil, false},
		{"omitzero with an IsZero", reflect.TypeFor[isZero](), nil, false},
		{"an invalid tag name", reflect.TypeFor[invalidTag](), nil, false},
		{"tag names with punctuation", reflect.TypeFor[punctuated](), punctuated{A: 1, B: 2}, true},
		{"a float that omitempty leaves out", reflect.TypeFor[omittedFloat](), nil, false},
		{"a float that omitzero leaves out", reflect.TypeFor[omittedZeroFloat](), nil, false},
		{"an int that omitempty leaves out", reflect.TypeFor[omittedInt](), omittedInt{N: 3}, true},
		{"a marshaler", reflect.TypeFor[jtMoney](), nil, false},
		{"a text marshaler", reflect.TypeFor[jtTextKey](), nil, false},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, valueOnlyJSON(tc.typ), tc.name)
		if tc.value == nil {
			continue
		}
		raw, err := json.Marshal(tc.value)
		require.NoError(t, err, tc.name)
		require.False(t, replacedUTF8(raw), tc.name)
		back := reflect.New(tc.typ)
		require.NoError(t, json.Unmarshal(raw, back.Interface()), tc.name)
		require.Equal(t, tc.value, back.Elem().Interface(), tc.name)
	}
}

func TestReplacedUTF8(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{"plain", false},
		{"süß \ufffd", false}, // a valid U+FFFD is written as it is
		{"bad \xff byte", true},
		{`the text \ufffd`, true}, // cannot be told apart: decoded again, which is safe
	} {
		raw, err := json.Marshal(tc.s)
		require.NoError(t, err)
		require.Equal(t, tc.want, replacedUTF8(raw), "%q encodes as %s", tc.s, raw)
	}
}
