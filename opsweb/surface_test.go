package opsweb_test

import (
	"testing"

	"github.com/idemflow/idemflow/internal/apitest"
)

// TestExportedAPI: testdata/api.txt is the package's exported API; a change to it
// shows in that file's diff (go test -run TestExportedAPI -update-api writes it).
func TestExportedAPI(t *testing.T) { apitest.Check(t, "testdata/api.txt") }
