// Package doccheck reads the repository's Markdown, so that tests can hold the
// documentation to the code: its links and anchors resolve, the commands and
// paths in its code exist, and the HTTP paths it tells a reader to open are
// served by the program that it names (the quick start, the demo).
//
// Its own tests check the links, commands and paths; the HTTP paths are
// checked by the tests that start the programs (cmd/quickstart's
// TestQuickstart, cmd/demo's TestDocumentedPaths), from the table in
// paths.go. It is imported by tests only.
package doccheck
