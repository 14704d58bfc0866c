// Command testrun is the README's test command, go run ./internal/testrun
// work: go test -json with the arguments it is given, printed as go test
// prints without -v (a line per package, and the output of what failed),
// then every test that skipped and why. go test alone says that a test
// skipped only with -v, so a run without PgBouncer or Chromium would pass
// without a word of the tests it did not run (internal/pgcluster's
// SkipMissing). Its exit status is go test's.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// event is one line of go test -json (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skip is a test that skipped, and why.
type skip struct {
	pkg, test, reason string
}

// pkgState is what a package's run has printed so far.
type pkgState struct {
	output map[string][]string // by test, "" for the package's own
	order  []string            // the tests, in the order they started
	failed map[string]bool
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testrun:", err)
		return 1
	}
	skips := report(out, stdout)
	err = cmd.Wait()
	if len(skips) > 0 {
		fmt.Fprintf(stdout, "\nskipped (%d; go test -v shows each where it ran):\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(stdout, "  %s %s: %s\n", s.pkg, s.test, s.reason)
		}
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		fmt.Fprintln(stderr, "testrun:", err)
		return 1
	}
	return 0
}

// report reads go test -json from r and writes to w what go test would
// without -v; it returns the tests that skipped, sorted.
func report(r io.Reader, w io.Writer) []skip {
	pkgs := map[string]*pkgState{}
	var skips []skip
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line) // not an event: go test's own words
			continue
		}
		if e.Action == "build-output" {
			fmt.Fprint(w, e.Output)
			continue
		}
		if e.Package == "" {
			continue
		}
		p := pkgs[e.Package]
		if p == nil {
			p = &pkgState{output: map[string][]string{}, failed: map[string]bool{}}
			pkgs[e.Package] = p
		}
		switch e.Action {
		case "run":
			p.order = append(p.order, e.Test)
		case "output":
			p.output[e.Test] = append(p.output[e.Test], e.Output)
		case "fail":
			if e.Test != "" {
				p.failed[e.Test] = true
				continue
			}
			for _, t := range p.order {
				if p.failed[t] {
					printTest(w, p.output[t])
				}
			}
			fmt.Fprint(w, strings.Join(p.output[""], ""))
			delete(pkgs, e.Package)
		case "pass", "skip":
			if e.Test != "" {
				if e.Action == "skip" {
					skips = append(skips, skip{e.Package, e.Test, reason(p.output[e.Test])})
				}
				delete(p.output, e.Test)
				continue
			}
			for _, l := range p.output[""] {
				if strings.HasPrefix(l, "ok  ") || strings.HasPrefix(l, "?   ") {
					fmt.Fprint(w, l)
				}
			}
			delete(pkgs, e.Package)
		}
	}
	slices.SortFunc(skips, func(a, b skip) int {
		return strings.Compare(a.pkg+" "+a.test, b.pkg+" "+b.test)
	})
	return skips
}

// printTest writes a failed test's output without the framing lines of
// go test -v (=== RUN, PAUSE, CONT).
func printTest(w io.Writer, lines []string) {
	for _, l := range lines {
		if !strings.HasPrefix(l, "=== ") {
			fmt.Fprint(w, l)
		}
	}
}

// logPrefix is what t.Log puts before a message: "    file_test.go:12: ".
var logPrefix = regexp.MustCompile(`^\s*[^\s:]+\.go:\d+: `)

// reason is what a skipped test said, without the framing lines and the file
// and line of each message.
func reason(lines []string) string {
	var out []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		out = append(out, strings.TrimSpace(logPrefix.ReplaceAllString(l, "")))
	}
	if len(out) == 0 {
		return "(no reason given)"
	}
	return strings.Join(out, " ")
}
