package doccheck_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/doccheck"
)

// docs parses README.md, CONTRIBUTING.md and docs/**/*.md (all: true), or
// README.md and the guide: the files whose commands and paths a reader runs.
func docs(t *testing.T, all bool) (string, []*doccheck.Doc) {
	t.Helper()
	root, err := doccheck.Root()
	require.NoError(t, err)
	files := []string{"README.md"}
	if all {
		files = append(files, "CONTRIBUTING.md")
		require.NoError(t, filepath.WalkDir(filepath.Join(root, "docs"), func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(root, p)
				files = append(files, rel)
			}
			return err
		}))
	} else {
		guide, err := filepath.Glob(filepath.Join(root, "docs/guide/*.md"))
		require.NoError(t, err)
		require.NotEmpty(t, guide, "no docs/guide/*.md")
		for _, g := range guide {
			rel, _ := filepath.Rel(root, g)
			files = append(files, rel)
		}
	}
	var out []*doccheck.Doc
	for _, f := range files {
		d, err := doccheck.Parse(filepath.Join(root, f))
		require.NoError(t, err)
		d.Path = f
		out = append(out, d)
	}
	return root, out
}

// TestLinks: every relative link of README.md, CONTRIBUTING.md and docs/
// names a file or directory that exists, and every #fragment a heading (or
// HTML anchor) of the Markdown file it names.
func TestLinks(t *testing.T) {
	t.Parallel()
	root, files := docs(t, true)
	parsed := map[string]*doccheck.Doc{}
	for _, d := range files {
		parsed[filepath.Join(root, d.Path)] = d
	}
	for _, d := range files {
		for _, l := range d.Links {
			if strings.Contains(l.Text, "://") || strings.HasPrefix(l.Text, "mailto:") {
				continue
			}
			p, frag, _ := strings.Cut(l.Text, "#")
			p, _, _ = strings.Cut(p, "?")
			target := filepath.Join(root, d.Path)
			switch {
			case strings.HasPrefix(p, "/"):
				target = filepath.Join(root, p)
			case p != "":
				target = filepath.Join(filepath.Dir(target), p)
			}
			st, err := os.Stat(target)
			if err != nil {
				t.Errorf("%s:%d: link %s: no such file or directory", d.Path, l.Line, l.Text)
				continue
			}
			if frag == "" {
				continue
			}
			if st.IsDir() {
				target = filepath.Join(target, "README.md")
			}
			if !strings.HasSuffix(target, ".md") {
				continue // a fragment of another kind of file, such as a line of code
			}
			td := parsed[target]
			if td == nil {
				if td, err = doccheck.Parse(target); err != nil {
					t.Errorf("%s:%d: link %s: %v", d.Path, l.Line, l.Text, err)
					continue
				}
				parsed[target] = td
			}
			if !td.Anchors[frag] {
				t.Errorf("%s:%d: link %s: %s has no heading whose anchor is #%s", d.Path, l.Line, l.Text, filepath.Base(target), frag)
			}
		}
	}
}

// TestHTTPPaths: the HTTP paths that README.md and the guide name are the
// keys of doccheck.Paths, which says which program serves each (and the
// programs' tests request them there), and it names none that they do not.
func TestHTTPPaths(t *testing.T) {
	t.Parallel()
	_, files := docs(t, false)
	named := map[string]bool{}
	for _, d := range files {
		for _, p := range doccheck.HTTPPaths(d) {
			named[p.Text] = true
			if _, ok := doccheck.Paths[p.Text]; !ok {
				t.Errorf("%s:%d: %s is not in doccheck.Paths: say there which program serves it (cmd/quickstart, cmd/demo), or that it is no path to request", d.Path, p.Line, p.Text)
			}
		}
	}
	for p := range doccheck.Paths {
		if !named[p] {
			t.Errorf("doccheck.Paths has %s, which README.md and the guide no longer name", p)
		}
	}
}

// TestCommands: every go test, go run, go build and go get in the code of
// README.md, CONTRIBUTING.md and docs/ (and every demo or idemflow command) names
// packages that exist, flags that they define, and for go test's -run and
// -bench, tests and benchmarks that the packages have.
func TestCommands(t *testing.T) {
	t.Parallel()
	root, files := docs(t, true)
	n := 0
	for _, d := range files {
		for _, c := range commands(d) {
			n++
			for _, problem := range checkCommand(root, c.Text) {
				t.Errorf("%s:%d: %s: %s", d.Path, c.Line, c.Text, problem)
			}
		}
	}
	require.Greater(t, n, 10, "the commands found in README.md, CONTRIBUTING.md and docs/")
}

// TestRepoPaths: every file or package path of the repository in the code of
// README.md and the guide exists: a code span such as `engine/doc.go` or
// `./cmd/demo`, a ./path in shell code, an import of the module in Go code.
func TestRepoPaths(t *testing.T) {
	t.Parallel()
	root, files := docs(t, false)
	entries, err := os.ReadDir(root)
	require.NoError(t, err)
	top := map[string]bool{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			top[e.Name()] = true
		}
	}
	exists := func(p string) bool {
		p = strings.TrimSuffix(strings.TrimSuffix(p, "/..."), "/")
		p, _, _ = strings.Cut(p, "#")
		m, err := filepath.Glob(filepath.Join(root, p))
		return err == nil && len(m) > 0
	}
	n := 0
	for _, d := range files {
		for _, s := range d.Spans {
			first, _, slash := strings.Cut(s.Text, "/")
			if !slash || strings.ContainsAny(s.Text, " (){}") || !(top[first] || first == ".") {
				continue
			}
			n++
			if !exists(s.Text) {
				t.Errorf("%s:%d: `%s`: no such file or directory", d.Path, s.Line, s.Text)
			}
		}
		for _, b := range d.Blocks {
			for i, line := range strings.Split(b.Text, "\n") {
				var paths []string
				switch {
				case b.Lang == "go":
					for _, m := range importPath.FindAllStringSubmatch(line, -1) {
						paths = append(paths, strings.TrimPrefix(m[1], "/"))
					}
				case isShell(b.Lang):
					line, _, _ = strings.Cut(line, " #")
					for _, f := range strings.Fields(line) {
						if strings.HasPrefix(f, "./") {
							paths = append(paths, f)
						}
					}
				}
				for _, p := range paths {
					n++
					if !exists(p) {
						t.Errorf("%s:%d: %s: no such file or directory", d.Path, b.Line+i, p)
					}
				}
			}
		}
	}
	require.Greater(t, n, 10, "the paths found in README.md and the guide")
}

var importPath = regexp.MustCompile(`"github\.com/idemflow/idemflow(/[^"]*)?"`)

func isShell(lang string) bool {
	switch lang {
	case "", "sh", "bash", "shell", "console":
		return true
	}
	return false
}

// commands returns the commands of d's shell code and of its code spans that
// begin with one: go, demo or idemflow, one per line or per && or ;.
func commands(d *doccheck.Doc) []doccheck.Ref {
	var out []doccheck.Ref
	add := func(text string, line int) {
		for _, c := range splitCommands(text) {
			if f := strings.Fields(c); len(f) > 0 {
				i := 0
				for i < len(f) && strings.Contains(f[i], "=") && !strings.HasPrefix(f[i], "-") {
					i++ // VAR=value
				}
				if i < len(f) && (f[i] == "go" || f[i] == "demo" || f[i] == "idemflow") {
					out = append(out, doccheck.Ref{Text: strings.Join(f[i:], " "), Line: line})
				}
			}
		}
	}
	for _, b := range d.Blocks {
		if !isShell(b.Lang) {
			continue
		}
		for i, line := range strings.Split(b.Text, "\n") {
			line, _, _ = strings.Cut(line, " #")
			add(strings.TrimPrefix(strings.TrimSpace(line), "$ "), b.Line+i)
		}
	}
	for _, s := range d.Spans {
		add(s.Text, s.Line)
	}
	return out
}

// splitCommands splits a shell line at ;, &&, || and | outside quotes.
func splitCommands(line string) []string {
	var out []string
	var quote byte
	start := 0
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ';' || c == '|' || c == '&' && i+1 < len(line) && line[i+1] == '&':
			out = append(out, line[start:i])
			if i+1 < len(line) && (line[i+1] == '|' || line[i+1] == '&') {
				i++
			}
			start = i + 1
		}
	}
	return append(out, line[start:])
}

// goTestFlags are go test's and go build's flags: those with a value, true;
// without, false.
var goTestFlags = map[string]bool{
	"run": true, "bench": true, "benchtime": true, "count": true, "timeout": true, "parallel": true,
	"cpu": true, "tags": true, "coverprofile": true, "covermode": true, "coverpkg": true, "p": true,
	"skip": true, "list": true, "o": true, "exec": true, "shuffle": true, "fuzz": true, "fuzztime": true,
	"modfile": true, "C": true, "ldflags": true, "gcflags": true, "outputdir": true, "cpuprofile": true,
	"memprofile": true, "blockprofile": true, "mutexprofile": true, "trace": true, "vet": true,
	"v": false, "race": false, "short": false, "cover": false, "json": false, "failfast": false,
	"benchmem": false, "x": false, "n": false, "a": false, "fullpath": false, "c": false,
}

// checkCommand returns what is wrong with the command c.
func checkCommand(root, c string) []string {
	args, err := split(c)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	switch {
	case args[0] == "demo" || args[0] == "idemflow":
		problems = append(problems, checkFlags(root, "./cmd/"+args[0], args[1:])...)
	case len(args) < 2:
	case args[1] == "run" || args[1] == "build":
		i := 2
		for i < len(args) && strings.HasPrefix(args[i], "-") {
			i++
		}
		if i == len(args) {
			return nil // the command's name, as in "`go run` and `go test`"
		}
		if !strings.HasPrefix(args[i], "./") {
			return nil // a file or a package outside the repository
		}
		if !mainPackage(filepath.Join(root, args[i])) {
			problems = append(problems, args[i]+" is no main package")
		}
		if args[1] == "run" {
			problems = append(problems, checkFlags(root, args[i], args[i+1:])...)
		}
	case args[1] == "get":
		for _, a := range args[2:] {
			p, _, _ := strings.Cut(a, "@")
			rel, ok := strings.CutPrefix(p, "github.com/idemflow/idemflow")
			if ok {
				if st, err := os.Stat(filepath.Join(root, rel)); err != nil || !st.IsDir() {
					problems = append(problems, p+": no such package in the repository")
				}
			}
		}
	case args[1] == "test":
		problems = append(problems, checkTest(root, args[2:])...)
	}
	return problems
}

// checkTest checks go test's arguments: its packages exist, its flags are go
// test's or the packages' tests', its -run and -bench match a test or a
// benchmark.
func checkTest(root string, args []string) []string {
	var problems, pkgs []string
	var other []string // the flags go test does not know: the tests' own
	vals := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-args" {
			for _, a := range args[i+1:] { // the test binary's flags, and their values
				if strings.HasPrefix(a, "-") {
					name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
					other = append(other, name)
				}
			}
			break
		}
		if !strings.HasPrefix(a, "-") {
			pkgs = append(pkgs, a)
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, known := goTestFlags[name]
		switch {
		case !known:
			other = append(other, name)
		case takes && !hasVal:
			if i+1 == len(args) {
				return []string{"-" + name + " has no value"}
			}
			i++
			val = args[i]
		}
		vals[name] = val
	}
	var dirs []string
	for _, p := range pkgs {
		switch {
		case p == "work" || p == "./...":
			dirs = append(dirs, root+"/...")
		case strings.HasPrefix(p, "./"):
			dir := filepath.Join(root, strings.TrimSuffix(p, "/..."))
			if st, err := os.Stat(dir); err != nil || !st.IsDir() {
				problems = append(problems, p+": no such package")
				continue
			}
			if strings.HasSuffix(p, "/...") {
				dir += "/..."
			}
			dirs = append(dirs, dir)
		default:
			problems = append(problems, p+": not a package of the repository (./path, ./..., or work)")
		}
	}
	if len(problems) > 0 {
		return problems
	}
	if len(dirs) == 0 {
		dirs = []string{root} // go test in the repository's root
	}
	tests := testFuncs(dirs)
	for _, f := range []struct{ flag, prefix string }{{"run", "Test"}, {"bench", "Benchmark"}} {
		pattern, ok := vals[f.flag]
		if !ok || pattern == "^$" {
			continue
		}
		top, _, _ := strings.Cut(pattern, "/")
		re, err := regexp.Compile(top)
		if err != nil {
			problems = append(problems, "-"+f.flag+": "+err.Error())
			continue
		}
		if !slices.ContainsFunc(tests.funcs, func(name string) bool { return strings.HasPrefix(name, f.prefix) && re.MatchString(name) }) {
			problems = append(problems, "-"+f.flag+" "+strconv.Quote(pattern)+" matches no "+f.prefix+" function of "+strings.Join(pkgs, " "))
		}
	}
	for _, name := range other {
		if !tests.flags[name] {
			problems = append(problems, "-"+name+": neither go test's flag nor one the packages' tests define")
		}
	}
	return problems
}

// tested is what the _test.go files of some packages define.
type tested struct {
	funcs []string        // their Test, Benchmark, Example and Fuzz functions
	flags map[string]bool // the flags they define
}

// testFuncs reads the _test.go files of dirs (a dir ending in /... and its
// subdirectories).
func testFuncs(dirs []string) tested {
	out := tested{flags: map[string]bool{}}
	for _, dir := range dirs {
		d := testFuncsOf(dir)
		out.funcs = append(out.funcs, d.funcs...)
		for f := range d.flags {
			out.flags[f] = true
		}
	}
	return out
}

var testFuncsCache sync.Map // dir -> tested

// testFuncsOf is testFuncs of one dir, read once.
func testFuncsOf(dir string) tested {
	if v, ok := testFuncsCache.Load(dir); ok {
		return v.(tested)
	}
	out := tested{flags: map[string]bool{}}
	var files []string
	if d, ok := strings.CutSuffix(dir, "/..."); ok {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != d && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata") {
				return filepath.SkipDir
			}
			if err == nil && strings.HasSuffix(p, "_test.go") {
				files = append(files, p)
			}
			return err
		})
	} else {
		files, _ = filepath.Glob(filepath.Join(dir, "*_test.go"))
	}
	for _, f := range files {
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				out.funcs = append(out.funcs, fn.Name.Name)
			}
		}
		for _, name := range flagNames(file) {
			out.flags[name] = true
		}
	}
	v, _ := testFuncsCache.LoadOrStore(dir, out)
	return v.(tested)
}

// flagDefs are the functions and methods of package flag (and of a
// *flag.FlagSet) that define a flag, and the index of the name among their
// arguments.
var flagDefs = map[string]int{
	"String": 0, "Int": 0, "Int64": 0, "Uint": 0, "Uint64": 0, "Bool": 0, "Duration": 0, "Float64": 0,
	"Func": 0, "BoolFunc": 0, "StringVar": 1, "IntVar": 1, "Int64Var": 1, "UintVar": 1, "Uint64Var": 1,
	"BoolVar": 1, "DurationVar": 1, "Float64Var": 1, "Var": 1, "TextVar": 1,
}

// flagNames returns the names of the flags that file defines, near enough:
// the string literal at the name's place in a call of a method or function so
// named (slog's and OpenTelemetry's attributes left out).
func flagNames(file *ast.File) []string {
	var out []string
	ast.Inspect(file, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "slog" || x.Name == "attribute") {
			return true
		}
		i, ok := flagDefs[sel.Sel.Name]
		if !ok || len(call.Args) <= i {
			return true
		}
		if lit, ok := call.Args[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out = append(out, s)
			}
		}
		return true
	})
	return out
}

// mainPackage reports whether dir holds a main package.
func mainPackage(dir string) bool {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err == nil && file.Name.Name == "main" {
			return true
		}
	}
	return false
}

var literalFlag = regexp.MustCompile(`^--?[a-zA-Z][\w.-]*$`)

var programFlags sync.Map // dir -> map[string]bool

// checkFlags checks that each flag of args (-name, -name=value) is defined by
// the program in pkg (./cmd/demo) or by a package of the repository that it
// imports, whatever its subcommand: near enough, and cheap.
func checkFlags(root, pkg string, args []string) []string {
	v, ok := programFlags.Load(pkg)
	if !ok {
		flags := map[string]bool{"h": true, "help": true}
		seen := map[string]bool{}
		var walk func(dir string)
		walk = func(dir string) {
			if seen[dir] {
				return
			}
			seen[dir] = true
			files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
				if err != nil {
					continue
				}
				for _, name := range flagNames(file) {
					flags[name] = true
				}
				// A flag that a subcommand reads by hand ("-force").
				ast.Inspect(file, func(n ast.Node) bool {
					if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil && literalFlag.MatchString(s) {
							flags[strings.TrimLeft(s, "-")] = true
						}
					}
					return true
				})
				for _, imp := range file.Imports {
					p, _ := strconv.Unquote(imp.Path.Value)
					if rel, ok := strings.CutPrefix(p, "github.com/idemflow/idemflow/"); ok {
						walk(filepath.Join(root, rel))
					}
				}
			}
		}
		walk(filepath.Join(root, pkg))
		v, _ = programFlags.LoadOrStore(pkg, flags)
	}
	flags := v.(map[string]bool)
	var problems []string
	for _, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || len(a) < 2 || !isLetter(strings.TrimLeft(a, "-")) {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags[name] {
			problems = append(problems, "-"+name+": "+pkg+" defines no such flag")
		}
	}
	return problems
}

func isLetter(s string) bool {
	return s != "" && (s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
}

// split splits a shell command into its words: quotes kept together and
// removed, no expansion.
func split(c string) ([]string, error) {
	var out []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range c {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, errUnclosed
	}
	if inWord {
		out = append(out, w.String())
	}
	if len(out) == 0 {
		return nil, errUnclosed
	}
	return out, nil
}

var errUnclosed = errors.New("an unclosed quote, or nothing")

// TestNotServed: which answers say that nothing serves a path.
func TestNotServed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status int
		body   string
		want   bool
	}{
		{http.StatusOK, `ok`, false},
		{http.StatusBadRequest, `{"error":{"code":"invalid_request"}}`, false},
		{http.StatusUnauthorized, ``, false},
		{http.StatusMethodNotAllowed, `{"error":{"code":"method_not_allowed"}}`, true},
		{http.StatusNotFound, "404 page not found\n", true},
		{http.StatusNotFound, `{"error":{"code":"not_found","message":"no such endpoint"}}`, true},
		{http.StatusNotFound, `{"code":"not_found","message":"no such page"}`, true},
		{http.StatusNotFound, `{"error":{"code":"operation_not_found"}}`, false},
		{http.StatusNotFound, `{"code":"operation_not_found"}`, false},
	} {
		require.Equal(t, tt.want, doccheck.NotServed(tt.status, []byte(tt.body)), "%d %s", tt.status, tt.body)
	}
}
