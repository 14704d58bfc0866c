package layout_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/idemflow/idemflow"

// imports lists, for each package that pattern names, the packages in the
// lists that fields name (go list's Imports, TestImports, Deps...). In the
// workspace (go.work), pattern names the packages of every module under the
// library's path: the library's, and those of cmd/ and contrib/.
func imports(t *testing.T, pattern string, fields ...string) map[string][]string {
	t.Helper()
	format := "{{.ImportPath}}"
	for _, f := range fields {
		format += "{{range ." + f + "}} {{.}}{{end}}"
	}
	return list(t, format, pattern)
}

// library returns the packages of the library's module: those that pattern
// names and that are in no other module (cmd/, contrib/).
func library(t *testing.T, pattern string) map[string]bool {
	t.Helper()
	lib := make(map[string]bool)
	for p, mod := range list(t, "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", pattern) {
		if len(mod) == 1 && mod[0] == module {
			lib[p] = true
		}
	}
	return lib
}

// list runs go list with format on the packages that pattern names, and
// returns each line's first field, the package, with the others.
func list(t *testing.T, format, pattern string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", format, module+"/"+pattern).Output()
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

// demo reports whether p is one of the demo's packages: its commands, its HTTP
// server (cmd/internal/demoapi) and its fake provider
// (cmd/internal/fakeprovider), all in the module of cmd/.
func demo(p string) bool {
	return p == module+"/cmd" || strings.HasPrefix(p, module+"/cmd/")
}

// TestImports: the rules that keep the library's parts apart.
func TestImports(t *testing.T) {
	if testing.Short() {
		t.Skip("go list is not run with -short")
	}
	t.Parallel()
	for p, deps := range imports(t, "store", "Deps") {
		for _, d := range deps {
			if strings.HasPrefix(d, "github.com/riverqueue/") {
				t.Errorf("%s depends on %s: store knows nothing of River (its schema is the engine's, internal/riverschema)", p, d)
			}
		}
	}
	for _, pattern := range []string{"steps/...", "workflows/..."} {
		for p, list := range imports(t, pattern, "Imports") {
			for _, d := range list {
				if d == module+"/store" || strings.HasPrefix(d, module+"/store/") {
					t.Errorf("%s imports %s: steps and workflows use the engine's API, never its store", p, d)
				}
			}
		}
	}
	// The library's module holds none of the demo's packages, and neither the
	// library nor its tests import one: the refund workflow's tests serve a
	// provider of their own.
	lib := library(t, "...")
	for p, list := range imports(t, "...", "Imports", "TestImports", "XTestImports") {
		if !lib[p] {
			continue
		}
		if demo(p) {
			t.Errorf("%s is in the library's module: the demo's packages are in cmd/'s", p)
		}
		for _, d := range list {
			if demo(d) {
				t.Errorf("%s (or its tests) imports %s: the library never imports the demo's packages", p, d)
			}
		}
	}
}
