package pgcluster

import (
	"fmt"
	"os"
	"testing"
)

// RequireAllEnv names the environment variable that makes a test whose
// program is missing (PostgreSQL's server binaries, PgBouncer, Chromium)
// fail rather than skip: .ci/run sets it, after it installed them, so that a
// run that skipped one cannot pass for a run that tested it. CI, set by most
// CI services, does the same.
const RequireAllEnv = "IDEMFLOW_REQUIRE_ALL"

// SkipMissing skips tb for a program that is not installed, saying which and
// why (the README's test command, go run ./internal/testrun, lists every skip
// and its reason at its end); under RequireAllEnv or CI it fails tb instead.
func SkipMissing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(RequireAllEnv) != "" || os.Getenv("CI") != "" {
		tb.Fatalf("%s (%s is set: every program the tests need must be installed)", msg, RequireAllEnv)
	}
	tb.Skip(msg)
}
