package layout_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/idemflow/idemflow"

// imports lists, for each package that pattern names, the packages it
// imports (not its tests'), or with deps every package it depends on.
func imports(t *testing.T, deps bool, pattern string) map[string][]string {
	t.Helper()
	field := "Imports"
	if deps {
		field = "Deps"
	}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .`+field+`}} {{.}}{{end}}`, module+"/"+pattern).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pattern, err)
	}
	m := make(map[string][]string)
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			m[f[0]] = f[1:]
		}
	}
	return m
}

// demo reports whether p is one of the demo's packages: its commands and
// HTTP server under cmd/, and the fake provider it (and the refund
// workflow's tests) run.
func demo(p string) bool {
	for _, d := range []string{module + "/cmd/", module + "/internal/fakeprovider"} {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

// TestImports: the rules that keep the library's parts apart.
func TestImports(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is not run with -short")
	}
	t.Parallel()
	for p, deps := range imports(t, true, "store") {
		for _, d := range deps {
			if strings.HasPrefix(d, "github.com/riverqueue/") {
				t.Errorf("%s depends on %s: store knows nothing of River (its schema is the engine's, internal/riverschema)", p, d)
			}
		}
	}
	for _, pattern := range []string{"steps/...", "workflows/..."} {
		for p, list := range imports(t, false, pattern) {
			for _, d := range list {
				if d == module+"/store" || strings.HasPrefix(d, module+"/store/") {
					t.Errorf("%s imports %s: steps and workflows use the engine's API, never its store", p, d)
				}
			}
		}
	}
	for p, list := range imports(t, false, "...") {
		if demo(p) {
			continue
		}
		for _, d := range list {
			if demo(d) {
				t.Errorf("%s imports %s: the library never imports the demo's packages", p, d)
			}
		}
	}
}
