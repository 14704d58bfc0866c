// Package store is the engine's storage: idemflow's schema migrations, the
// queries that sqlc generates from queries/, and thin typed wrappers over them.
// A service that uses idemflow needs none of it: engine.Migrate applies the
// migrations, and the engine runs the queries. The migration runner
// (MigrationSet) serves the repository's own sets too (the demo's ledger, the
// fake provider, the benchmark).
//
// Every method takes a DBTX, so the same Store serves a pool, a connection or a
// transaction: the engine decides where a transaction begins and ends. No generated
// or pgtype type appears in this package's API. operation.go has the queries of
// idemflow_operation, step.go those of steps (idemflow_step_row, the view
// idemflow_step_recorded); schema.go tells whether this build's statements fit
// a schema that a newer build migrated (SchemaVersions, CheckStatements).
//
// # Errors
//
// A read that finds nothing returns ErrNotFound. Some conditional writes report
// whether they took effect, because for the engine "already done" can be an
// ordinary answer; those sent ahead of a COMMIT in the same round trip fail
// instead (ErrKeyTaken, ErrFenced), so that the COMMIT does not run.
package store
