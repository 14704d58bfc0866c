package layout_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, from this package's directory.
var root = filepath.Join("..", "..")

// directives returns the arguments of every verb directive of a go.mod or
// go.work file, one slice per line, in both forms: `verb a b` and a
// parenthesized block of `a b` lines. Comments are dropped, quotes removed.
// It reads what these files hold, not the whole grammar (golang.org/x/mod's
// modfile does that, and is not a dependency of the library).
func directives(t *testing.T, text, verb string) [][]string {
	t.Helper()
	var out [][]string
	inBlock := false
	for n, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case inBlock && f[0] == ")":
			inBlock = false
			continue
		case inBlock:
		case f[0] != verb:
			continue
		case len(f) == 2 && f[1] == "(":
			inBlock = true
			continue
		default:
			f = f[1:]
		}
		for i, a := range f {
			if u, err := strconv.Unquote(a); err == nil {
				f[i] = u
			} else if strings.HasPrefix(a, `"`) || strings.HasPrefix(a, "`") {
				t.Fatalf("line %d: %q: %v", n+1, a, err)
			}
		}
		out = append(out, f)
	}
	if inBlock {
		t.Fatalf("a %s block is not closed", verb)
	}
	return out
}

// requires returns the versions that the go.mod file at path (from the
// repository's root) requires, by module path.
func requires(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	m := make(map[string]string)
	for _, r := range directives(t, string(b), "require") {
		if len(r) != 2 {
			t.Fatalf("%s: a require of %d fields: %q", path, len(r), r)
		}
		m[r[0]] = r[1]
	}
	return m
}

func TestDirectives(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, verb, text string
		want             [][]string
	}{
		{"line", "require", "module x\n\nrequire a.b/c v1.2.3 // indirect\n", [][]string{{"a.b/c", "v1.2.3"}}},
		{"block", "require", "require (\n\ta v1.0.0\n\n\t// a comment\n\tb v2.0.0 // indirect\n)\nrequire c v3.0.0\n",
			[][]string{{"a", "v1.0.0"}, {"b", "v2.0.0"}, {"c", "v3.0.0"}}},
		{"other verbs", "require", "go 1.26.0\ntool (\n\ta/cmd/x\n)\nreplace a => ../\n", nil},
		{"quoted", "use", "use (\n\t.\n\t\"./cmd\"\n)\n", [][]string{{"."}, {"./cmd"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := directives(t, tt.text, tt.verb)
			if !slices.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("directives(%q, %q) = %q, want %q", tt.text, tt.verb, got, tt.want)
			}
		})
	}
}

// TestModuleVersions: the library's dependencies are required at one version
// in every module file of the repository: go.mod (what users import), the
// tools' tools/go.mod (whose build of the library is what staticcheck and
// sqlc see), and the workspace's other modules (cmd, contrib/...). A version
// that differs builds, tests or vets the library with code that its users do
// not get. Modules that the library does not require (the tools' own, the
// demo's) may differ.
func TestModuleVersions(t *testing.T) {
	t.Parallel()
	lib := requires(t, "go.mod")
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"tools/go.mod"}
	for _, u := range directives(t, string(b), "use") {
		if dir := filepath.Clean(u[0]); dir != "." {
			files = append(files, filepath.ToSlash(filepath.Join(dir, "go.mod")))
		}
	}
	if len(files) < 2 {
		t.Fatalf("go.work uses no module besides the library: %q", files)
	}
	for _, f := range files {
		for mod, v := range requires(t, f) {
			if want, ok := lib[mod]; ok && v != want {
				t.Errorf("%s requires %s %s, go.mod %s: the library's dependencies have one version in every module file; "+
					"raise the lower with go get %s@VERSION in its module (tools/go.mod: GOWORK=off go get -modfile=tools/go.mod)",
					f, mod, v, want, mod)
			}
		}
	}
}
