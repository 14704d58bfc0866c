// Package apitest holds a package's exported API in a file of its own, so
// that every change to it shows in that file's diff (as the Go project's
// api/*.txt do): Check compares the package's declarations, as go doc -all
// prints them without their documentation, with the file.
package apitest

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"
)

var update = flag.Bool("update-api", false, "rewrite the packages' testdata/api.txt from their code")

// Check fails t when the exported API of the package in the test's
// directory differs from the file path holds; with -update-api it rewrites
// the file instead.
func Check(t *testing.T, path string) {
	t.Helper()
	if testing.Short() {
		t.Skip("apitest: go doc is not run with -short")
	}
	out, err := exec.Command("go", "doc", "-all", ".").Output()
	if err != nil {
		t.Fatalf("apitest: go doc -all: %v", err)
	}
	got := Declarations(out)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("apitest: %v (write it by running the package's tests with -update-api)", err)
	}
	if bytes.Equal(got, want) {
		return
	}
	var added, removed []string
	wantSet, gotSet := lines(want), lines(got)
	for l := range gotSet {
		if !wantSet[l] {
			added = append(added, "+ "+l)
		}
	}
	for l := range wantSet {
		if !gotSet[l] {
			removed = append(removed, "- "+l)
		}
	}
	t.Fatalf("the package's API is not %s: write it again by running the package's tests with -update-api, and review the diff\n%s",
		path, strings.Join(append(removed, added...), "\n"))
}

// Declarations keeps, of go doc -all's output, the declarations from its
// first section on: no package documentation, no doc comments (indented by
// four spaces), no comments inside declarations, no blank lines.
func Declarations(doc []byte) []byte {
	var b bytes.Buffer
	started := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), " \t")
		switch {
		case !started:
			started = l == "CONSTANTS" || l == "VARIABLES" || l == "FUNCTIONS" || l == "TYPES"
			if !started {
				continue
			}
		case l == "", strings.HasPrefix(l, "    "), strings.HasPrefix(strings.TrimLeft(l, "\t"), "//"):
			continue
		}
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func lines(b []byte) map[string]bool {
	m := make(map[string]bool)
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			m[l] = true
		}
	}
	return m
}
