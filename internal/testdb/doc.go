// Package testdb gives each test a PostgreSQL database of its own, fully migrated and
// holding no application rows, cloned in milliseconds from a template database. Import
// it only from _test.go files.
//
// # Server
//
// The databases live on the server named by TEST_DATABASE_URL, else DATABASE_URL (a
// postgres:// URL whose user may create databases; the URL's database is used only to
// create and drop others), else on the cluster that pgcluster runs in
// pgcluster.TestDataDir, which the first test process starts and leaves running for the
// next; pgtestctl stop stops it. The server is set up once per test process.
//
// # Template
//
// The template database is named after a hash of idemflow's migrations and River's, so
// a change to either gets a new template: it is created and migrated once, by whichever
// test process gets there first (the others wait on an advisory lock), then marked as a
// template that accepts no connections. Nobody may stay connected to it, since
// PostgreSQL refuses to copy a database that has other users. Templates of older
// schemas are left in place.
//
// # Cleanup
//
// A test's database is dropped when the test ends, after its pool is closed, unless the
// test failed: then it is kept, and its URL logged, for inspection.
package testdb
