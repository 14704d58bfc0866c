package pgcluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PgBouncerConfig configures StartPgBouncer: a PgBouncer in transaction mode
// (pool_mode=transaction) in front of one PostgreSQL server.
type PgBouncerConfig struct {
	// Dir holds its configuration and its log (pgbouncer.log). Required; it
	// is created when missing and given to the user that runs PgBouncer.
	Dir string
	// ServerURL names the server and the user to reach it as, such as a
	// Cluster's URL: its host, port, user and password (the database is
	// ignored: every database of the server is served under its own name).
	// Clients connect as that user, without a password (auth_type=trust).
	ServerURL string
	// PoolSize is default_pool_size: the server connections that PgBouncer
	// keeps per database. Defaults to 20.
	PoolSize int
	// MaxClientConn is max_client_conn. Defaults to 1000.
	MaxClientConn int
	// Settings are more settings of the [pgbouncer] section, such as
	// server_login_retry. They override the ones above.
	Settings map[string]string
	// Restart starts PgBouncer again, on the same port, when it exits by
	// itself, as a supervisor would: PgBouncer 1.18 (Debian 12's) exits on
	// a FATAL when a cancel request's client goes away before the cancel is
	// sent (pgbouncer issues #801 and #904), and pgx sends one whenever it
	// gives up on a statement. Restarts counts them.
	Restart bool
}

// PgBouncer is a running PgBouncer, started by StartPgBouncer.
type PgBouncer struct {
	port    int
	user    string
	dir     string
	restart bool
	start   func() (*exec.Cmd, error)

	mu       sync.Mutex
	cmd      *exec.Cmd // the running one
	stopping bool
	restarts int
	exited   chan struct{} // closed when it exited for good
}

// PgBouncerPath returns the path of the pgbouncer program: on PATH, else in
// /usr/sbin, where Debian's package puts it (off PATH for other users than
// root).
func PgBouncerPath() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("pgcluster: no pgbouncer on PATH or in /usr/sbin (Debian: apt-get install pgbouncer)")
}

// StartPgBouncer starts PgBouncer in the foreground, as a child of this
// process, on a free port of 127.0.0.1 (no Unix-domain socket), as the user
// that runs the cluster's servers (PgBouncer refuses root too), and returns
// once it accepts connections. Stop it with Stop.
func StartPgBouncer(ctx context.Context, cfg *PgBouncerConfig) (*PgBouncer, error) {
	bin, err := PgBouncerPath()
	if err != nil {
		return nil, err
	}
	if cfg == nil || cfg.Dir == "" || cfg.ServerURL == "" {
		return nil, errors.New("pgcluster: PgBouncerConfig.Dir and ServerURL are required")
	}
	server, err := url.Parse(cfg.ServerURL)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: PgBouncer's server URL: %w", err)
	}
	u, err := lookupServerUser()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if err := u.chown(dir); err != nil {
		return nil, err
	}
	if err := u.checkReachable(filepath.Join(dir, "pgbouncer.ini"), true, slog.New(slog.DiscardHandler)); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	user := cmp.Or(server.User.Username(), Superuser)
	password, _ := server.User.Password()
	serverPort := cmp.Or(server.Port(), "5432")
	target := fmt.Sprintf("host=%s port=%s user=%s", server.Hostname(), serverPort, user)
	if password != "" {
		target += " password=" + password
	}
	settings := map[string]string{
		"listen_addr":       "127.0.0.1",
		"listen_port":       strconv.Itoa(port),
		"unix_socket_dir":   "",
		"auth_type":         "trust",
		"auth_file":         filepath.Join(dir, "userlist.txt"),
		"admin_users":       user,
		"pool_mode":         "transaction",
		"default_pool_size": strconv.Itoa(cmp.Or(cfg.PoolSize, 20)),
		"max_client_conn":   strconv.Itoa(cmp.Or(cfg.MaxClientConn, 1000)),
	}
	maps.Copy(settings, cfg.Settings)
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = %s\n\n[pgbouncer]\n", target)
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&ini, "%s = %s\n", k, settings[k])
	}
	files := map[string]string{
		"pgbouncer.ini": ini.String(),
		"userlist.txt":  fmt.Sprintf("%q \"\"\n", user),
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return nil, fmt.Errorf("pgcluster: write %s: %w", name, err)
		}
		if err := u.chown(path); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	start := func() (*exec.Cmd, error) {
		log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		defer func() { _ = log.Close() }() // the child has its own copy
		cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		cmd.Dir = "/"
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: u.cred}
		setParentDeathSignal(cmd.SysProcAttr)
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("pgcluster: start pgbouncer: %w", err)
		}
		return cmd, nil
	}
	cmd, err := start()
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{port: port, user: user, dir: dir, restart: cfg.Restart, start: start, cmd: cmd, exited: make(chan struct{})}
	go b.supervise()
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			_ = c.Close()
			return b, nil
		}
		select {
		case <-b.exited:
			return nil, fmt.Errorf("pgcluster: pgbouncer exited at start: %s", logTail(logPath))
		case <-ctx.Done():
			_ = b.Stop()
			return nil, fmt.Errorf("pgcluster: pgbouncer did not start: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns a URL for database through the PgBouncer.
func (b *PgBouncer) URL(database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.PathEscape(b.user), b.port, url.PathEscape(database))
}

// Port returns the TCP port it listens on, at 127.0.0.1.
func (b *PgBouncer) Port() int { return b.port }

// Dir returns its directory, which holds its log, pgbouncer.log.
func (b *PgBouncer) Dir() string { return b.dir }

// supervise waits for PgBouncer to exit, and starts it again when it exited
// by itself and PgBouncerConfig.Restart is set.
func (b *PgBouncer) supervise() {
	defer close(b.exited)
	for {
		b.mu.Lock()
		cmd := b.cmd
		b.mu.Unlock()
		_ = cmd.Wait()
		b.mu.Lock()
		if b.stopping || !b.restart {
			b.mu.Unlock()
			return
		}
		b.restarts++
		b.mu.Unlock()
		time.Sleep(100 * time.Millisecond) // its port is free again
		next, err := b.start()
		b.mu.Lock()
		if err != nil || b.stopping {
			if next != nil {
				_ = next.Process.Kill()
				_ = next.Wait()
			}
			b.mu.Unlock()
			return
		}
		b.cmd = next
		b.mu.Unlock()
	}
}

// Restarts counts the times it exited by itself and was started again
// (PgBouncerConfig.Restart).
func (b *PgBouncer) Restarts() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.restarts
}

// Stop shuts it down at once (SIGTERM: its clients are disconnected), and
// kills it when it has not exited 5 seconds later.
func (b *PgBouncer) Stop() error {
	b.mu.Lock()
	b.stopping = true
	cmd := b.cmd
	b.mu.Unlock()
	select {
	case <-b.exited:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = cmd.Process.Kill()
	<-b.exited
	return errors.New("pgcluster: pgbouncer did not stop on SIGTERM, and was killed")
}

// StartPgBouncerT is StartPgBouncer for a test, in front of the server of
// serverURL (such as a test database's URL): it skips the test when no
// pgbouncer is installed, fails it when PgBouncer does not start, and stops
// it at cleanup. cfg may be nil; its Dir and ServerURL are set here.
func StartPgBouncerT(t testing.TB, serverURL string, cfg *PgBouncerConfig) *PgBouncer {
	t.Helper()
	if _, err := PgBouncerPath(); err != nil {
		SkipMissing(t, "no PgBouncer: %v", err)
	}
	c := PgBouncerConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Dir, c.ServerURL = filepath.Join(t.TempDir(), "pgbouncer"), serverURL
	b, err := StartPgBouncer(t.Context(), &c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("pgbouncer's log: %s", logTail(filepath.Join(c.Dir, "pgbouncer.log")))
		}
	})
	return b
}
