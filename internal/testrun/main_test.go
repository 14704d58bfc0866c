package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReport: what go test -json says is printed as go test prints it
// without -v, and every skip is returned with its reason, sorted.
func TestReport(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"Action":"start","Package":"p/empty"}`,
		`{"Action":"output","Package":"p/empty","Output":"?   \tp/empty\t[no test files]\n"}`,
		`{"Action":"skip","Package":"p/empty"}`,
		`{"Action":"run","Package":"p","Test":"TestB"}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"=== RUN   TestB\n"}`,
		`{"Action":"run","Package":"p","Test":"TestB/sub"}`,
		`{"Action":"output","Package":"p","Test":"TestB/sub","Output":"=== RUN   TestB/sub\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    p_test.go:4: no chromium on PATH\n"}`,
		`{"Action":"output","Package":"p","Test":"TestB/sub","Output":"    --- SKIP: TestB/sub (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestB/sub"}`,
		`{"Action":"pass","Package":"p","Test":"TestB"}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"    p_test.go:3: no PgBouncer: not installed\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestA"}`,
		`{"Action":"run","Package":"p","Test":"TestC"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"=== RUN   TestC\n"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"    p_test.go:6: broken\n"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"--- FAIL: TestC (0.00s)\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestC"}`,
		`{"Action":"run","Package":"p","Test":"TestD"}`,
		`{"Action":"output","Package":"p","Test":"TestD","Output":"    p_test.go:9: not shown\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestD"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\n"}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t0.005s\n"}`,
		`{"Action":"fail","Package":"p"}`,
		`{"Action":"output","Package":"q","Output":"PASS\n"}`,
		`{"Action":"output","Package":"q","Output":"ok  \tq\t0.1s\n"}`,
		`{"Action":"pass","Package":"q"}`,
		`FAIL`,
	}, "\n")
	var out strings.Builder
	skips := report(strings.NewReader(in), &out)
	require.Equal(t, "?   \tp/empty\t[no test files]\n"+
		"    p_test.go:6: broken\n--- FAIL: TestC (0.00s)\nFAIL\nFAIL\tp\t0.005s\n"+
		"ok  \tq\t0.1s\n"+
		"FAIL\n", out.String())
	require.Equal(t, []skip{
		{"p", "TestA", "no PgBouncer: not installed"},
		{"p", "TestB/sub", "no chromium on PATH"},
	}, skips)
}
