package main

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/doccheck"
	"github.com/idemflow/idemflow/internal/testdb"
)

// TestDocumentedPaths: every path that README.md and the guide say the demo
// serves (internal/doccheck's Paths) is routed, with its method, by a demo
// started as `go run ./cmd/demo` starts it: a mount that served nothing fails
// here. An operation's id in a path is one that does not exist, which a routed
// path answers as such (operation_not_found); a POST's body is one no endpoint
// takes, so that none changes anything.
func TestDocumentedPaths(t *testing.T) {
	t.Parallel()
	d := startDemo(t, testdb.URL(t), nil)
	paths := doccheck.ServedBy(doccheck.Demo)
	require.NotEmpty(t, paths)
	id := uuid.NewString()
	for _, p := range paths {
		method, path := doccheck.Request(p, id)
		token := tokenA
		if strings.HasPrefix(path, "/ops") || strings.HasPrefix(path, "/admin/") {
			token = defaultAdminToken
		}
		var body any
		if method != http.MethodGet {
			body = `{"documented":true}`
		}
		r := d.client(t, token).do(method, path, "", body)
		require.False(t, doccheck.NotServed(r.status, r.body), "%s, documented: %d %s", p, r.status, r.body)
	}
}
