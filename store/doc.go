// Package store is idemflow's persistence: the schema migrations, the queries that
// sqlc generates from queries/, and thin typed wrappers over them.
//
// Every method takes a DBTX, so the same Store serves a pool, a connection or a
// transaction: the engine decides where a transaction begins and ends. No generated
// or pgtype type appears in this package's API.
//
// # Errors
//
// A read that finds nothing returns ErrNotFound. Conditional writes report whether
// they took effect instead of failing, because for the engine "already done" is an
// ordinary answer, not an error.
package store
