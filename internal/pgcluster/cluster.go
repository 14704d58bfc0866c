package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// Superuser is the cluster's superuser, which connects with trust authentication.
	Superuser = "postgres"

	// portFileName is the file in the data directory that keeps the server's TCP port.
	portFileName = "pgcluster.port"
	// logFileName is the server's log file in the data directory.
	logFileName = "server.log"
	// initSuffix names the sibling directory that initdb fills before it is renamed
	// into place, so that an interrupted initdb never leaves a half-made data directory.
	initSuffix = ".initdb"
	// lockSuffix names the lock file beside the data directory.
	lockSuffix = ".lock"

	// probeTimeout bounds one attempt to connect to the server.
	probeTimeout = 5 * time.Second
	// readyTimeout bounds the wait for a server that another process started.
	readyTimeout = 2 * time.Minute
	// readyPollInterval is how often that wait tries to connect.
	readyPollInterval = 100 * time.Millisecond
	// pgCtlTimeout is pg_ctl's -t: how many seconds start and stop may take.
	pgCtlTimeout = "120"
	// logTailBytes is how much of the server log an error quotes.
	logTailBytes = 2048

	// sqlstateTooManyConnections is the error of a server that is up but full.
	sqlstateTooManyConnections = "53300"
)

// defaultSettings are the server settings that Config.Settings may override.
var defaultSettings = map[string]string{
	// Many parallel tests, each with a pool.
	"max_connections": "300",
}

// managedSettings are set by pgcluster itself and may not appear in Config.Settings.
var managedSettings = []string{"listen_addresses", "port", "unix_socket_directories"}

// settingNameRE matches a server setting name (custom ones have a dotted prefix).
var settingNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// Config configures a cluster. A Config is read by Ensure and Stop and not kept.
type Config struct {
	// DataDir is the cluster's data directory. Required. It is created (mode 0700) and
	// initialised with initdb when missing or empty; its parent directory is created
	// too, and holds the lock file DataDir + ".lock". A relative path is taken from the
	// working directory.
	DataDir string

	// Settings are extra server settings, passed as -c name=value when Ensure starts
	// the server; they do not change a server that is already running. They override
	// the defaults (max_connections=300), but may not set listen_addresses, port or
	// unix_socket_directories, which pgcluster manages. Setting fsync to "off" also
	// makes initdb skip its final sync. Defaults to none.
	Settings map[string]string

	// Logger receives a line when a cluster is initialised, started or stopped.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// OpenParents, when this process runs as root, adds the search permission for
	// others (o+x, not the right to list) to every parent of DataDir that the
	// unprivileged server user could not pass, such as /root for the demo's default
	// directory, logging each change. Without it, such a DataDir is an error.
	OpenParents bool

	// StandbyOf, when set, is the URL of a running primary: a missing data
	// directory is then made a streaming standby of it (pg_basebackup -R)
	// instead of a new cluster, for failover tests. Promote makes it a
	// primary.
	StandbyOf string
}

// validate checks the configuration.
func (c *Config) validate() error {
	if c == nil || c.DataDir == "" {
		return errors.New("pgcluster: Config.DataDir is required")
	}
	for name := range c.Settings {
		if !settingNameRE.MatchString(name) {
			return fmt.Errorf("pgcluster: invalid setting name %q", name)
		}
		if slices.Contains(managedSettings, strings.ToLower(name)) {
			return fmt.Errorf("pgcluster: setting %q is managed by pgcluster and may not be set", name)
		}
	}
	return nil
}

// Cluster is a running PostgreSQL cluster, returned by Ensure. Its methods other than
// Stop are safe for concurrent use.
type Cluster struct {
	dataDir     string
	settings    map[string]string
	logger      *slog.Logger
	openParents bool
	standbyOf   string
	port        int
	startedHere bool

	// Set by prepare: only the slow paths run PostgreSQL's programs.
	binDir string
	user   *serverUser
}

// newCluster validates cfg and returns a Cluster that is not running yet.
func newCluster(cfg *Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: data directory: %w", err)
	}
	settings := maps.Clone(defaultSettings)
	maps.Copy(settings, cfg.Settings)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Cluster{dataDir: dataDir, settings: settings, logger: logger, openParents: cfg.OpenParents, standbyOf: cfg.StandbyOf}, nil
}

// Ensure starts the cluster in cfg.DataDir, initialising it first when the directory is
// missing or empty, or reuses the server already running on that directory: a cluster
// left running by another process, even a killed one, is reused, never started twice.
// It is safe when several processes call it at once, which serialise on an flock on the
// file cfg.DataDir + ".lock". When the server answers, Ensure returns after connecting
// once, without running any program.
//
// Ensure never stops the server: the caller may call Stop, typically only when
// StartedHere reports true, and knowing that other processes may be using it.
func Ensure(ctx context.Context, cfg *Config) (*Cluster, error) {
	c, err := newCluster(cfg)
	if err != nil {
		return nil, err
	}
	if c.reuse(ctx) {
		return c, nil
	}

	if err := os.MkdirAll(filepath.Dir(c.dataDir), 0o755); err != nil {
		return nil, fmt.Errorf("pgcluster: create parent of data directory: %w", err)
	}
	unlock, err := lockFile(ctx, c.dataDir+lockSuffix)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if c.reuse(ctx) { // another process started it while this one waited for the lock
		return c, nil
	}

	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.initialise(ctx); err != nil {
		return nil, err
	}
	// Up but not answering on the kept port: still starting or recovering, or started
	// by hand on another port. Wait for it rather than start it twice.
	reused, err := c.awaitRunning(ctx)
	if err != nil {
		return nil, err
	}
	if reused {
		c.logger.InfoContext(ctx, "reusing postgres cluster", slog.String("data_dir", c.dataDir), slog.Int("port", c.port))
		return c, nil
	}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// ErrNotRunning is returned by Attach when no server runs on the data
// directory.
var ErrNotRunning = errors.New("pgcluster: no server runs on the data directory")

// Attach returns the cluster whose server runs on cfg.DataDir, or ErrNotRunning.
// Unlike Ensure, it creates, initialises, starts and changes nothing: for a
// command that only uses a database that something else runs.
func Attach(ctx context.Context, cfg *Config) (*Cluster, error) {
	c, err := newCluster(cfg)
	if err != nil {
		return nil, err
	}
	if !c.reuse(ctx) {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, c.dataDir)
	}
	return c, nil
}

// Stop stops the server running in cfg.DataDir, if any, with pg_ctl stop -m fast, and
// reports whether one was running. It neither creates nor initialises anything.
func Stop(ctx context.Context, cfg *Config) (stopped bool, err error) {
	c, err := newCluster(cfg)
	if err != nil {
		return false, err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	unlock, err := lockFile(ctx, c.dataDir+lockSuffix)
	if err != nil {
		return false, err
	}
	defer unlock()
	if err := c.prepare(); err != nil {
		return false, err
	}
	pf, err := readPIDFile(c.dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if processState(pf.pid) != processAlive {
		return false, nil
	}
	if err := c.stop(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// Promote makes a standby (Config.StandbyOf) the primary, and waits until it
// accepts writes (pg_ctl promote -w).
func (c *Cluster) Promote(ctx context.Context) error {
	if err := c.prepare(); err != nil {
		return err
	}
	if out, err := c.run(ctx, "pg_ctl", "promote", "-w", "-t", pgCtlTimeout, "-D", c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Kill kills the server with SIGKILL, as a crash of its host would, and
// waits until its port is free; what it had not written is lost, and its
// data directory needs recovery at the next start.
func (c *Cluster) Kill(ctx context.Context) error {
	pf, err := readPIDFile(c.dataDir)
	if err != nil {
		return fmt.Errorf("pgcluster: kill: %w", err)
	}
	if err := syscall.Kill(pf.pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgcluster: kill %d: %w", pf.pid, err)
	}
	for processState(pf.pid) == processAlive {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// URL returns a URL for database on the cluster, usable by pgx: user postgres, no
// password, sslmode=disable.
func (c *Cluster) URL(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the TCP port the server listens on, at 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the cluster's absolute data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// StartedHere reports whether the call to Ensure that returned c started the server,
// rather than reusing one that was running.
func (c *Cluster) StartedHere() bool { return c.startedHere }

// Stop stops the server with pg_ctl stop -m fast, disconnecting every client, and waits
// until it has stopped. It fails if the server is not running.
func (c *Cluster) Stop(ctx context.Context) error {
	unlock, err := lockFile(ctx, c.dataDir+lockSuffix)
	if err != nil {
		return err
	}
	defer unlock()
	if err := c.prepare(); err != nil {
		return err
	}
	return c.stop(ctx)
}

// reuse reports whether the server answers on the kept port, and takes that port.
// Without a pid file no server runs on the directory, and nothing is tried.
func (c *Cluster) reuse(ctx context.Context) bool {
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); err != nil {
		return false
	}
	port, err := readPort(c.dataDir)
	if err != nil {
		return false
	}
	c.port = port
	if err := c.probe(ctx); err != nil {
		c.logger.DebugContext(ctx, "postgres cluster does not answer", slog.String("data_dir", c.dataDir), slog.Int("port", port), slog.String("error", err.Error()))
		return false
	}
	return true
}

// probe connects to the server on c.port and checks that it serves c.dataDir.
func (c *Cluster) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateTooManyConnections {
			// Up but full: ours if its pid file names this port.
			if pf, perr := readPIDFile(c.dataDir); perr == nil && pf.port == c.port {
				return nil
			}
		}
		return fmt.Errorf("pgcluster: connect: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return fmt.Errorf("pgcluster: read data_directory: %w", err)
	}
	if !sameDir(dir, c.dataDir) {
		return fmt.Errorf("pgcluster: port %d is served by the cluster in %s, not %s", c.port, dir, c.dataDir)
	}
	return nil
}

// prepare finds the binaries and the user that runs them, and checks that the user
// can reach the data directory.
func (c *Cluster) prepare() error {
	if c.binDir != "" {
		return nil
	}
	binDir, err := BinDir()
	if err != nil {
		return err
	}
	u, err := lookupServerUser()
	if err != nil {
		return err
	}
	if err := u.checkReachable(c.dataDir, c.openParents, c.logger); err != nil {
		return err
	}
	c.binDir, c.user = binDir, u
	return nil
}

// initialise runs initdb when the data directory is missing or empty. initdb fills a
// sibling directory, renamed into place once complete.
func (c *Cluster) initialise(ctx context.Context) error {
	entries, err := os.ReadDir(c.dataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist), err == nil && len(entries) == 0:
	case err != nil:
		return fmt.Errorf("pgcluster: read data directory: %w", err)
	default:
		return c.checkDataDir()
	}

	tmp := c.dataDir + initSuffix
	if err := os.RemoveAll(tmp); err != nil { // left by an interrupted initdb: this process holds the lock
		return fmt.Errorf("pgcluster: remove %s: %w", tmp, err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("pgcluster: create data directory: %w", err)
	}
	if err := c.user.chown(tmp); err != nil {
		return err
	}
	if c.standbyOf != "" {
		// A copy of the primary that streams from it (-R writes
		// standby.signal and primary_conninfo).
		if out, err := c.run(ctx, "pg_basebackup", "-D", tmp, "-d", c.standbyOf, "-R", "-X", "stream", "--checkpoint=fast"); err != nil {
			return fmt.Errorf("pgcluster: pg_basebackup %s: %w\n%s", c.dataDir, err, out)
		}
	} else {
		args := []string{"-D", tmp, "-U", Superuser, "--auth=trust", "-E", "UTF8", "--locale=C"}
		if strings.EqualFold(c.settings["fsync"], "off") {
			args = append(args, "--no-sync")
		}
		if out, err := c.run(ctx, "initdb", args...); err != nil {
			return fmt.Errorf("pgcluster: initdb %s: %w\n%s", c.dataDir, err, out)
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	if err := c.writePort(tmp, port); err != nil {
		return err
	}
	// rename(2) replaces an empty directory.
	if err := os.Rename(tmp, c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: move initialised data directory into place: %w", err)
	}
	c.logger.InfoContext(ctx, "initialised postgres cluster", slog.String("data_dir", c.dataDir), slog.String("bin_dir", c.binDir))
	return nil
}

// checkDataDir checks that a directory that is not empty is a data directory that the
// server's user owns.
func (c *Cluster) checkDataDir() error {
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err != nil {
		return fmt.Errorf("pgcluster: %s is neither empty nor a PostgreSQL data directory: %w", c.dataDir, err)
	}
	fi, err := os.Stat(c.dataDir)
	if err != nil {
		return fmt.Errorf("pgcluster: data directory: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && c.user.cred != nil && st.Uid != c.user.uid {
		return fmt.Errorf("pgcluster: data directory %s is owned by uid %d, not by user %s (uid %d), which runs PostgreSQL because this process runs as root",
			c.dataDir, st.Uid, c.user.name, c.user.uid)
	}
	return nil
}

// awaitRunning waits until the server named by postmaster.pid answers, taking the port
// from that file, and reports whether it did. It reports false at once when there is no
// such file, or when the process it names is dead.
func (c *Cluster) awaitRunning(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		pf, err := readPIDFile(c.dataDir)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		switch processState(pf.pid) {
		case processGone:
			return false, nil // the server removes a stale pid file itself
		case processZombie:
			// Dead, but not reaped (by a PID 1 that does not reap orphans): the server
			// would take it for alive and refuse to start. Its shared memory, which the
			// server checks apart from this file, is no longer attached.
			c.logger.WarnContext(ctx, "removing postmaster.pid of a dead server", slog.String("data_dir", c.dataDir), slog.Int("pid", pf.pid))
			if err := os.Remove(filepath.Join(c.dataDir, "postmaster.pid")); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return false, fmt.Errorf("pgcluster: remove stale postmaster.pid: %w", err)
			}
			return false, nil
		}
		if pf.port != 0 && pf.port != c.port {
			c.port = pf.port
			if err := c.writePort(c.dataDir, pf.port); err != nil {
				return false, err
			}
		}
		err = c.probe(ctx)
		if err == nil {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("pgcluster: a server runs on %s (PID %d) but does not answer on port %d; see %s: %w",
				c.dataDir, pf.pid, c.port, filepath.Join(c.dataDir, logFileName), err)
		case <-time.After(readyPollInterval):
		}
	}
}

// start starts the server on the kept port, or on a new free port when the kept one
// is missing or taken.
func (c *Cluster) start(ctx context.Context) error {
	port, err := readPort(c.dataDir)
	if err != nil || !portFree(port) {
		if port, err = freePort(); err != nil {
			return err
		}
		if err := c.writePort(c.dataDir, port); err != nil {
			return err
		}
	}
	c.port = port

	logFile := filepath.Join(c.dataDir, logFileName)
	out, err := c.run(ctx, "pg_ctl", "start", "-w", "-t", pgCtlTimeout, "-D", c.dataDir, "-l", logFile, "-o", c.serverOptions())
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl start: %w\n%s\nend of %s:\n%s", err, out, logFile, logTail(logFile))
	}
	if err := c.probe(ctx); err != nil {
		return fmt.Errorf("pgcluster: server started but does not answer: %w", err)
	}
	c.startedHere = true
	c.logger.InfoContext(ctx, "started postgres cluster", slog.String("data_dir", c.dataDir), slog.Int("port", c.port), slog.String("log", logFile))
	return nil
}

// stop runs pg_ctl stop -m fast.
func (c *Cluster) stop(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "stop", "-w", "-t", pgCtlTimeout, "-m", "fast", "-D", c.dataDir); err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop: %w\n%s", err, out)
	}
	c.logger.InfoContext(ctx, "stopped postgres cluster", slog.String("data_dir", c.dataDir))
	return nil
}

// serverOptions returns pg_ctl's -o: the server's settings as -c options. pg_ctl runs
// the server through /bin/sh, so each option is quoted for it.
func (c *Cluster) serverOptions() string {
	settings := maps.Clone(c.settings)
	settings["listen_addresses"] = "127.0.0.1"
	settings["port"] = strconv.Itoa(c.port)
	settings["unix_socket_directories"] = "" // TCP only: no socket or lock file to place
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("-c ")
		b.WriteString(shellQuote(name + "=" + settings[name]))
	}
	return b.String()
}

// run runs one of PostgreSQL's programs as the server's user and returns its output.
// The program's output goes to a file, never to a pipe that a server it starts could
// inherit, and it runs in its own process group, so that signals sent to this
// process's group (a Ctrl-C, go test's timeout) do not reach it.
func (c *Cluster) run(ctx context.Context, program string, args ...string) (string, error) {
	out, err := os.CreateTemp("", "pgcluster-*.out")
	if err != nil {
		return "", fmt.Errorf("pgcluster: create output file: %w", err)
	}
	defer func() {
		_ = out.Close()
		_ = os.Remove(out.Name())
	}()
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, program), args...)
	cmd.Dir = "/" // the working directory may be out of the server user's reach
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.user.cred}
	runErr := cmd.Run()
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return "", fmt.Errorf("pgcluster: read output of %s: %w", program, err)
	}
	if runErr != nil {
		runErr = fmt.Errorf("%s: %w", program, runErr)
	}
	return strings.TrimSpace(string(b)), runErr
}

// writePort keeps port in the data directory dir.
func (c *Cluster) writePort(dir string, port int) error {
	path := filepath.Join(dir, portFileName)
	if err := os.WriteFile(path, []byte(strconv.Itoa(port)+"\n"), 0o600); err != nil {
		return fmt.Errorf("pgcluster: keep port: %w", err)
	}
	return c.user.chown(path)
}

// readPort returns the port kept in the data directory.
func readPort(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, portFileName))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: read port: %w", err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: parse port: %w", err)
	}
	return port, nil
}

// pidFile is what pgcluster reads of a server's postmaster.pid.
type pidFile struct {
	pid int
	// port is 0 while the server has not written it yet.
	port int
}

// readPIDFile reads the data directory's postmaster.pid: the server's PID on line 1,
// its port on line 4.
func readPIDFile(dataDir string) (pidFile, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return pidFile{}, fmt.Errorf("pgcluster: read postmaster.pid: %w", err)
	}
	lines := strings.Split(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return pidFile{}, fmt.Errorf("pgcluster: postmaster.pid has no PID: %q", lines[0])
	}
	pf := pidFile{pid: pid}
	if len(lines) > 3 {
		pf.port, _ = strconv.Atoi(strings.TrimSpace(lines[3])) // 0 when not written yet
	}
	return pf, nil
}

// freePort returns a TCP port that is free on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFree reports whether port can be listened on at 127.0.0.1.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// sameDir reports whether a and b name the same directory.
func sameDir(a, b string) bool {
	ai, err := os.Stat(a)
	if err != nil {
		return false
	}
	bi, err := os.Stat(b)
	if err != nil {
		return false
	}
	return os.SameFile(ai, bi)
}

// shellQuote quotes s as one /bin/sh word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// logTail returns the end of the server log, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer func() { _ = f.Close() }()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTailBytes {
		if _, err := f.Seek(-logTailBytes, io.SeekEnd); err != nil {
			return "(unreadable log: " + err.Error() + ")"
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return "(unreadable log: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(b))
}
