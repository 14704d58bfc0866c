// Package pguuid holds UUID, the Go type of uuid columns in sqlc's generated
// code.
//
// A github.com/google/uuid.UUID is a driver.Valuer, and pgx encodes a
// driver.Valuer through its Value method: a string, which pgx cannot send as
// a binary uuid, so every such parameter first fails to encode (an error is
// formatted) and is then sent as text. Measured in cmd/bench: about 8% of the
// Go CPU of a refund. UUID has the same bytes and none of uuid.UUID's methods
// but pgx's UUIDValuer and UUIDScanner, so pgx encodes and scans it in binary
// directly. Convert at the boundary: uuid.UUID(u) and pguuid.UUID(id).
package pguuid

import (
	"errors"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// UUID is a uuid.UUID as pgx sends and reads it.
type UUID uuid.UUID

var (
	_ pgtype.UUIDValuer  = UUID{}
	_ pgtype.UUIDScanner = (*UUID)(nil)
)

// UUIDValue returns u for pgx.
func (u UUID) UUIDValue() (pgtype.UUID, error) {
	return pgtype.UUID{Bytes: u, Valid: true}, nil
}

// ScanUUID reads a uuid from pgx. NULL is an error: a nullable column is a *UUID.
func (u *UUID) ScanUUID(v pgtype.UUID) error {
	if !v.Valid {
		return errors.New("pguuid: cannot scan NULL into UUID")
	}
	*u = UUID(v.Bytes)
	return nil
}

// String returns u in the canonical form.
func (u UUID) String() string {
	return uuid.UUID(u).String()
}

// Ptr converts a *uuid.UUID, which may be nil.
func Ptr(id *uuid.UUID) *UUID {
	if id == nil {
		return nil
	}
	u := UUID(*id)
	return &u
}

// FromPtr converts a *UUID, which may be nil.
func FromPtr(u *UUID) *uuid.UUID {
	if u == nil {
		return nil
	}
	id := uuid.UUID(*u)
	return &id
}
