package demoapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

// maxIDLen bounds the ids that clients choose (order and customer ids).
const maxIDLen = 255

func decodeOrder(r *http.Request, f idempotency.Fields) (refund.OrderInput, error) {
	in := refund.OrderInput{Client: clientOf(r)}
	if err := f.Only("orderId", "customerId", "amount", "metadata"); err != nil {
		return in, err
	}
	if err := requiredID(f, "orderId", &in.OrderID); err != nil {
		return in, err
	}
	if err := requiredID(f, "customerId", &in.CustomerID); err != nil {
		return in, err
	}
	if err := positiveAmount(f, &in.Amount); err != nil {
		return in, err
	}
	return in, metadata(f, &in.Metadata)
}

func decodeRefund(r *http.Request, f idempotency.Fields) (refund.RefundInput, error) {
	in := refund.RefundInput{Client: clientOf(r)}
	if err := f.Only("orderId", "amount", "metadata"); err != nil {
		return in, err
	}
	if err := requiredID(f, "orderId", &in.OrderID); err != nil {
		return in, err
	}
	if err := positiveAmount(f, &in.Amount); err != nil {
		return in, err
	}
	return in, metadata(f, &in.Metadata)
}

func requiredID(f idempotency.Fields, name string, dst *string) error {
	if err := f.Required(name, dst); err != nil {
		return err
	}
	if *dst == "" || len(*dst) > maxIDLen {
		return &idempotency.FieldError{Param: name, Message: "must be a string of 1 to 255 bytes"}
	}
	if hasControl(*dst) {
		return &idempotency.FieldError{Param: name, Message: "must not contain control characters"}
	}
	return nil
}

// hasControl reports whether s holds a C0 control character or DEL.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// possibleID reports whether id, taken raw from a request's path, could name an
// order or a refund: 1 to 255 bytes of valid UTF-8 without control characters,
// as requiredID admits (refund ids are the demo's own, and shorter). Any other id
// names nothing, and is not sent to the database, which refuses NUL bytes and
// invalid UTF-8 with an error rather than finding no row.
func possibleID(id string) bool {
	return id != "" && len(id) <= maxIDLen && utf8.ValidString(id) && !hasControl(id)
}

// maxAmount bounds an amount (a trillion minor units less one), so that no sum of
// a client's balances can overflow.
const maxAmount = 999_999_999_999

func positiveAmount(f idempotency.Fields, dst *int64) error {
	if err := f.Required("amount", dst); err != nil {
		return err
	}
	if *dst <= 0 || *dst > maxAmount {
		return &idempotency.FieldError{Param: "amount", Message: "must be a positive integer (minor units) of at most 999999999999"}
	}
	return nil
}

// metadata keeps the client's metadata as sent, when it is a JSON object.
func metadata(f idempotency.Fields, dst *json.RawMessage) error {
	raw, ok := f["metadata"]
	if !ok || string(raw) == "null" {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return &idempotency.FieldError{Param: "metadata", Message: "must be a JSON object"}
	}
	*dst = raw
	return nil
}
