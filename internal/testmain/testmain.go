// Package testmain is the TestMain of the library's packages: it runs their
// tests, closes what internal/testdb keeps for the process, and fails the run
// when a goroutine outlives the tests (an engine, a pool or a server left
// running), with go.uber.org/goleak.
package testmain

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemflow/idemflow/internal/testdb"
)

// Run runs m's tests and exits; call it from TestMain.
func Run(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	testdb.Close()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
