package idempotency_test

import (
	"testing"

	"github.com/idemflow/idemflow/internal/apitest"
)

// TestAPI: testdata/api.txt is the package's exported API; a change to it
// shows in that file's diff (go test -run TestAPI -update-api writes it).
func TestAPI(t *testing.T) { apitest.Check(t, "testdata/api.txt") }
