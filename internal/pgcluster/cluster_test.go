package pgcluster

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// helperEnv makes the test binary act as a process that calls Ensure (see TestMain).
const helperEnv = "PGCLUSTER_TEST_HELPER_DATA_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(helperMain(dir))
	}
	os.Exit(m.Run())
}

// helperMain calls Ensure on dataDir, prints whether it started the server, and waits
// to be killed: it stands for a test process that dies without cleaning up.
func helperMain(dataDir string) int {
	c, err := Ensure(context.Background(), testConfig(dataDir))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("started:", c.StartedHere(), "port:", c.Port())
	select {}
}

// testConfig returns the configuration of a cluster for one test.
func testConfig(dataDir string) *Config {
	return &Config{
		DataDir:  dataDir,
		Settings: map[string]string{"fsync": "off", "max_connections": "20"},
	}
}

// newDataDir returns a data directory that does not exist yet, under a directory that
// the server's user can reach (t.TempDir is mode 0700), and stops any server in it at
// cleanup.
func newDataDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "pgcluster-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(parent, 0o755))
	dataDir := filepath.Join(parent, "data")
	t.Cleanup(func() {
		ctx := context.WithoutCancel(t.Context())
		_, err := Stop(ctx, &Config{DataDir: dataDir})
		require.NoError(t, err)
		require.NoError(t, os.RemoveAll(parent))
	})
	return dataDir
}

// serverPID returns the PID of the server running on dataDir.
func serverPID(t *testing.T, dataDir string) int {
	t.Helper()
	pf, err := readPIDFile(dataDir)
	require.NoError(t, err)
	return pf.pid
}

// query runs a query that returns one text value on database of c.
func query(t *testing.T, c *Cluster, database, sql string) string {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), c.URL(database))
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(context.WithoutCancel(t.Context()))) }()
	var v string
	require.NoError(t, conn.QueryRow(t.Context(), sql).Scan(&v))
	return v
}

// waitGone waits until the process pid has exited (a zombie counts as exited). A killed
// server's exit cannot be awaited otherwise: it is not this process's child.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool { return processState(pid) != processAlive }, time.Minute, 10*time.Millisecond,
		"process %d did not exit", pid)
}

func TestEnsure(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dataDir := newDataDir(t)

	// The subtests run in order, each from the state the one before left.
	c, err := Ensure(ctx, testConfig(dataDir))
	require.NoError(t, err)

	t.Run("InitialisesAndStarts", func(t *testing.T) {
		require.True(t, c.StartedHere())
		require.FileExists(t, filepath.Join(dataDir, "PG_VERSION"))
		require.NoDirExists(t, dataDir+initSuffix)
		require.Equal(t, "on", query(t, c, "postgres", "SELECT current_setting('is_superuser')"))
		require.Equal(t, "off", query(t, c, "postgres", "SHOW fsync"))
		require.Equal(t, "20", query(t, c, "postgres", "SHOW max_connections"))
		require.Equal(t, "127.0.0.1", query(t, c, "postgres", "SHOW listen_addresses"))
		require.Empty(t, query(t, c, "postgres", "SHOW unix_socket_directories"))
		require.Equal(t, "UTF8", query(t, c, "postgres", "SHOW server_encoding"))
		if os.Geteuid() == 0 {
			fi, err := os.Stat(dataDir)
			require.NoError(t, err)
			u, err := lookupServerUser()
			require.NoError(t, err)
			require.Equal(t, u.uid, fi.Sys().(*syscall.Stat_t).Uid, "data directory owned by %s", unprivilegedUser)
		}
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "CREATE DATABASE kept")
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
	})

	t.Run("ReusesRunningServer", func(t *testing.T) {
		pid := serverPID(t, dataDir)
		again, err := Ensure(ctx, testConfig(dataDir))
		require.NoError(t, err)
		require.False(t, again.StartedHere())
		require.Equal(t, c.URL("kept"), again.URL("kept"))
		require.Equal(t, pid, serverPID(t, dataDir), "same server process")
	})

	t.Run("RestartsStoppedServer", func(t *testing.T) {
		require.NoError(t, c.Stop(ctx))
		require.NoFileExists(t, filepath.Join(dataDir, "postmaster.pid"))
		again, err := Ensure(ctx, testConfig(dataDir))
		require.NoError(t, err)
		require.True(t, again.StartedHere())
		require.Equal(t, c.Port(), again.Port(), "the kept port")
		require.Equal(t, "kept", query(t, again, "kept", "SELECT current_database()"))
	})

	t.Run("RestartsAfterServerCrash", func(t *testing.T) {
		pid := serverPID(t, dataDir)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		waitGone(t, pid)
		require.FileExists(t, filepath.Join(dataDir, "postmaster.pid"), "a stale pid file")
		again, err := Ensure(ctx, testConfig(dataDir))
		require.NoError(t, err)
		require.True(t, again.StartedHere())
		require.NotEqual(t, pid, serverPID(t, dataDir))
		require.Equal(t, "kept", query(t, again, "kept", "SELECT current_database()"))
	})

	t.Run("TakesNewPortWhenKeptOneIsTaken", func(t *testing.T) {
		require.NoError(t, c.Stop(ctx))
		// Another server (here, a plain listener) took the port meanwhile.
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port())))
		require.NoError(t, err)
		defer func() { require.NoError(t, l.Close()) }()
		again, err := Ensure(ctx, testConfig(dataDir))
		require.NoError(t, err)
		require.True(t, again.StartedHere())
		require.NotEqual(t, c.Port(), again.Port())
		port, err := readPort(dataDir)
		require.NoError(t, err)
		require.Equal(t, again.Port(), port, "the new port is kept")
	})

	t.Run("StopReportsWhetherRunning", func(t *testing.T) {
		stopped, err := Stop(ctx, &Config{DataDir: dataDir})
		require.NoError(t, err)
		require.True(t, stopped)
		stopped, err = Stop(ctx, &Config{DataDir: dataDir})
		require.NoError(t, err)
		require.False(t, stopped)
	})
}

// TestEnsureFromParallelProcesses starts the server from several processes at once, as
// go test does with packages, kills them, and checks that one started it, the others
// reused it, and that it survived them.
func TestEnsureFromParallelProcesses(t *testing.T) {
	t.Parallel()
	const processes = 4
	dataDir := newDataDir(t)

	type result struct {
		line string
		err  error
	}
	results := make(chan result, processes)
	for range processes {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+dataDir)
		// Its own process group, killed whole below, as a terminal or CI kills go test.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		go func() {
			line, err := bufio.NewReader(stdout).ReadString('\n')
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			results <- result{strings.TrimSpace(line), err}
		}()
	}

	var started, reused int
	ports := map[string]bool{}
	for range processes {
		r := <-results
		require.NoError(t, r.err)
		fields := strings.Fields(r.line) // started: <bool> port: <port>
		require.Len(t, fields, 4, "helper said %q", r.line)
		switch fields[1] {
		case "true":
			started++
		case "false":
			reused++
		}
		ports[fields[3]] = true
	}
	require.Equal(t, 1, started, "exactly one process starts the server")
	require.Equal(t, processes-1, reused)
	require.Len(t, ports, 1)

	// The helpers were killed with their process groups; the server lives on.
	c, err := Ensure(t.Context(), testConfig(dataDir))
	require.NoError(t, err)
	require.False(t, c.StartedHere())
	for port := range ports {
		require.Equal(t, port, strconv.Itoa(c.Port()))
	}
	require.Equal(t, "1", query(t, c, "postgres", "SELECT 1::text"))
}

func TestEnsureRejectsUnreachableDataDir(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root runs the server as another user")
	}
	parent := t.TempDir() // mode 0700, owned by root
	_, err := Ensure(t.Context(), testConfig(filepath.Join(parent, "data")))
	require.ErrorContains(t, err, "not reachable by user nobody")
	require.ErrorContains(t, err, "(mode -rwx------) is not searchable")
	require.NoDirExists(t, filepath.Join(parent, "data"))
}

func TestEnsureRejectsBadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*Config{
		"NoConfig":         nil,
		"NoDataDir":        {},
		"ManagedSetting":   {DataDir: "x", Settings: map[string]string{"port": "5432"}},
		"ManagedSettingUC": {DataDir: "x", Settings: map[string]string{"Listen_Addresses": "*"}},
		"BadSettingName":   {DataDir: "x", Settings: map[string]string{"fsync=off -c x": "y"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := Ensure(t.Context(), cfg)
			require.Error(t, err)
		})
	}
}

func TestEnsureRejectsForeignDirectory(t *testing.T) {
	t.Parallel()
	dataDir := newDataDir(t)
	require.NoError(t, os.MkdirAll(dataDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "notes.txt"), []byte("mine"), 0o644))
	_, err := Ensure(t.Context(), testConfig(dataDir))
	require.ErrorContains(t, err, "neither empty nor a PostgreSQL data directory")
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestBinDir(t *testing.T) {
	t.Parallel()
	dir, err := BinDir()
	require.NoError(t, err)
	require.True(t, filepath.IsAbs(dir))
	for _, name := range binaries {
		require.FileExists(t, filepath.Join(dir, name))
	}
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"15", "15", 0},
		{"9.6", "15", -1},
		{"16", "15", 1},
		{"15", "15.1", -1},
		{"devel", "15", 1},
	} {
		got := compareVersions(tt.a, tt.b)
		require.Equal(t, tt.want, max(-1, min(1, got)), "compareVersions(%q, %q)", tt.a, tt.b)
	}
}

func TestServerOptions(t *testing.T) {
	t.Parallel()
	c, err := newCluster(&Config{DataDir: "x", Settings: map[string]string{"application_name": "it's", "max_connections": "7"}})
	require.NoError(t, err)
	c.port = 5555
	require.Equal(t,
		`-c 'application_name=it'\''s' -c 'listen_addresses=127.0.0.1' -c 'max_connections=7' -c 'port=5555' -c 'unix_socket_directories='`,
		c.serverOptions())
}
