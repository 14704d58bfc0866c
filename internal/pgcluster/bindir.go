package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// errNoBinaries is returned by BinDir when no PostgreSQL server binaries are found.
var errNoBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in PATH or /usr/lib/postgresql/*/bin: install the PostgreSQL server (e.g. apt-get install postgresql)")

// binaries are the programs pgcluster runs; a directory is used only when it has all.
var binaries = []string{"initdb", "pg_ctl", "postgres"}

// BinDir returns the directory holding the PostgreSQL server binaries: the directory of
// pg_ctl found in PATH (symbolic links resolved, so that initdb and postgres come from
// the same installation), else the newest /usr/lib/postgresql/<version>/bin. The error
// names what to install when neither has them.
func BinDir() (string, error) {
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); hasBinaries(dir) {
			return dir, nil
		}
	}
	dirs, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	if err != nil {
		return "", fmt.Errorf("pgcluster: look for PostgreSQL binaries: %w", err)
	}
	// Newest first: compare the version directories numerically ("9.6" < "15").
	slices.SortFunc(dirs, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, dir := range dirs {
		if hasBinaries(dir) {
			return dir, nil
		}
	}
	return "", errNoBinaries
}

// hasBinaries reports whether dir holds every program in binaries.
func hasBinaries(dir string) bool {
	for _, name := range binaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// compareVersions compares dotted version strings part by part, numerically where both
// parts are numbers.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		an, aErr := strconv.Atoi(as[i])
		bn, bErr := strconv.Atoi(bs[i])
		switch {
		case aErr == nil && bErr == nil && an != bn:
			if an < bn {
				return -1
			}
			return 1
		case (aErr != nil || bErr != nil) && as[i] != bs[i]:
			return strings.Compare(as[i], bs[i])
		}
	}
	return len(as) - len(bs)
}
