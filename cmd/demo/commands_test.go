package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCommandsChangeNothing: demo ops and demo db touch nothing they were not
// asked to: no cluster is made or started, no directory created, and their
// flags and -h work wherever they are given.
func TestCommandsChangeNothing(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	require.NoError(t, os.Chmod(home, 0o700))
	dataDir := filepath.Join(home, "pg")
	getenv := func(k string) string {
		switch k {
		case "HOME":
			return home
		case "XDG_DATA_HOME":
			return filepath.Join(home, "xdg")
		}
		return ""
	}
	demo := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(args, getenv, &out, &errOut)
		return code, out.String(), errOut.String()
	}

	for _, args := range [][]string{
		{"ops", "list"},
		{"ops", "-data-dir", dataDir, "list", "failed"},
		{"ops", "-data-dir", dataDir, "show", "0193a6f0-0000-7000-8000-000000000001"},
	} {
		code, _, stderr := demo(args...)
		require.Equal(t, 1, code, "%v: %s", args, stderr)
		require.Contains(t, stderr, "no demo database runs in", args)
	}
	code, stdout, stderr := demo("db", "-data-dir", dataDir, "stop")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "no PostgreSQL cluster runs in "+dataDir)
	code, stdout, _ = demo("db", "stop", "-data-dir", dataDir)
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "no PostgreSQL cluster runs")
	code, _, stderr = demo("db", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "usage: demo db")
	code, _, stderr = demo("db")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "usage: demo db")

	for _, dir := range []string{dataDir, filepath.Join(home, "xdg")} {
		_, err := os.Stat(dir)
		require.ErrorIs(t, err, os.ErrNotExist, "%s was created", dir)
	}
	info, err := os.Stat(home)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), info.Mode().Perm(), "the home directory's permissions are as they were")
}
