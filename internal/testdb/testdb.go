package testdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/internal/riverschema"
	"github.com/idemflow/idemflow/store"
)

const (
	// templatePrefix starts the names of template databases.
	templatePrefix = "idemflow_tpl_"
	// databasePrefix starts the names of test databases.
	databasePrefix = "t_"
	// maxIdentifierLen is PostgreSQL's limit on a database name, in bytes (NAMEDATALEN-1).
	maxIdentifierLen = 63
	// suffixBytes is how many random bytes end a test database's name (twice as many
	// hex digits).
	suffixBytes = 6

	// templateFormat changes the template's name when Migrate or the template's setup
	// change in a way that the migration files do not show. Bump it then.
	templateFormat = "1"
	// templateLockKey is the advisory lock that serialises the creation of templates
	// across test processes.
	templateLockKey int64 = 0x69_64_65_6d_74_70_6c // "idemtpl"

	// setupTimeout bounds starting the server and migrating the template.
	setupTimeout = 5 * time.Minute
	// cleanupTimeout bounds dropping a test's database.
	cleanupTimeout = time.Minute
	// adminMaxConns caps the connections that create and drop databases, per process.
	adminMaxConns = 4

	// sqlstateDuplicateDatabase is PostgreSQL's error for a name already taken.
	sqlstateDuplicateDatabase = "42P04"
)

// server is what every test of the process shares.
type server struct {
	// adminURL is the URL of the maintenance database.
	adminURL *url.URL
	// admin creates and drops databases. It never connects to a template.
	admin *pgxpool.Pool
	// template is the name of the migrated template database.
	template string
}

// shared sets the server up once per test process. It is the package's only state: a
// once, set on first use and never changed, since tests of one process share the server.
var shared = sync.OnceValues(setUp)

// URL returns the URL of a new database for tb, migrated and holding no application
// rows. The database is dropped at cleanup when tb passed, and kept (its URL logged)
// when tb failed.
func URL(tb testing.TB) string {
	tb.Helper()
	s := sharedServer(tb)
	ctx := tb.Context()

	name, err := s.createDatabase(ctx, tb.Name())
	require.NoError(tb, err, "testdb: create database")
	dbURL := s.databaseURL(name)

	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("testdb: kept the database of the failed test: %s", dbURL)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+quote(name)+" WITH (FORCE)")
		require.NoError(tb, err, "testdb: drop database %s", name)
	})
	return dbURL
}

// Pool returns a pool on a new database for tb, as URL gives. The pool is closed at
// cleanup, before the database is dropped.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	dbURL := URL(tb)
	pool, err := pgxpool.New(tb.Context(), dbURL)
	require.NoError(tb, err, "testdb: open pool")
	tb.Cleanup(pool.Close) // cleanups run last in, first out: before URL's drop
	require.NoError(tb, pool.Ping(tb.Context()), "testdb: connect to %s", dbURL)
	return pool
}

// AdminURL returns the URL of the server's maintenance database, on which the test
// databases are created. Tests must not change it.
func AdminURL(tb testing.TB) string {
	tb.Helper()
	return sharedServer(tb).adminURL.String()
}

// sharedServer returns the process's server, failing tb if it could not be set up.
func sharedServer(tb testing.TB) *server {
	tb.Helper()
	s, err := shared()
	require.NoError(tb, err, "testdb: set up the test server")
	return s
}

// setUp finds or starts the server and makes sure that the template exists. Its context
// is its own: the first test to call it must not decide for the others.
func setUp() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()

	rawURL, err := serverURL(ctx)
	if err != nil {
		return nil, err
	}
	adminURL, err := url.Parse(rawURL)
	if err != nil || (adminURL.Scheme != "postgres" && adminURL.Scheme != "postgresql") {
		return nil, fmt.Errorf("testdb: server URL must be a postgres:// URL (got %q)", rawURL)
	}
	template, err := templateName()
	if err != nil {
		return nil, err
	}
	s := &server{adminURL: adminURL, template: template}
	if err := s.ensureTemplate(ctx); err != nil {
		return nil, err
	}

	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, fmt.Errorf("testdb: parse server URL: %w", err)
	}
	cfg.MaxConns = adminMaxConns
	// It lives as long as the test process, like the server it uses; Close
	// closes it once every test has run.
	if s.admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, fmt.Errorf("testdb: connect to server: %w", err)
	}
	opened.Store(s)
	return s, nil
}

// opened is the server that setUp made, if a test has used one.
var opened atomic.Pointer[server]

// Close closes the connections that the package keeps for the tests of a
// process, once they have all run (see internal/testmain).
func Close() {
	if s := opened.Load(); s != nil {
		s.admin.Close()
	}
}

// serverURL returns the URL of the maintenance database of the server to use.
func serverURL(ctx context.Context) (string, error) {
	for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if v := os.Getenv(name); v != "" {
			return v, nil
		}
	}
	cfg := pgcluster.TestClusterConfig()
	cfg.Logger = slog.Default()
	c, err := pgcluster.Ensure(ctx, cfg)
	if err != nil {
		return "", fmt.Errorf("testdb: start the test cluster (or set TEST_DATABASE_URL): %w", err)
	}
	return c.URL("postgres"), nil
}

// templateName returns the name of the template for the current migrations: a hash of
// idemflow's migration files, River's migrations and templateFormat.
func templateName() (string, error) {
	h := sha256.New()
	h.Write([]byte("format " + templateFormat + "\x00"))
	err := fs.WalkDir(store.Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(store.Migrations(), path)
		if err != nil {
			return err
		}
		writeField(h, []byte(path))
		writeField(h, b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("testdb: hash idemflow's migrations: %w", err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(nil), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", fmt.Errorf("testdb: read River's migrations: %w", err)
	}
	for _, m := range migrator.AllVersions() {
		writeField(h, []byte(strconv.Itoa(m.Version)))
		writeField(h, []byte(m.SQLUp))
	}
	return templatePrefix + hex.EncodeToString(h.Sum(nil)[:6]), nil
}

// writeField writes b to h preceded by its length, so that fields cannot run together.
func writeField(h hash.Hash, b []byte) {
	_, _ = h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
	_, _ = h.Write(b)
}

// ensureTemplate creates and migrates the template unless another process has. A
// dedicated connection holds the advisory lock, so that closing it releases the lock
// whatever happens.
func (s *server) ensureTemplate(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.adminURL.String())
	if err != nil {
		return fmt.Errorf("testdb: connect to server: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return fmt.Errorf("testdb: lock template creation: %w", err)
	}

	var isTemplate bool
	err = conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", s.template).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		return nil
	case err == nil:
		// Left by a process that stopped while migrating it.
		if _, err := conn.Exec(ctx, "DROP DATABASE "+quote(s.template)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("testdb: drop unfinished template %s: %w", s.template, err)
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("testdb: look for template %s: %w", s.template, err)
	}

	if _, err := conn.Exec(ctx, "CREATE DATABASE "+quote(s.template)); err != nil {
		return fmt.Errorf("testdb: create template %s: %w", s.template, err)
	}
	if err := migrate(ctx, s.databaseURL(s.template)); err != nil {
		return err
	}
	// A template that accepts no connections cannot be held open by mistake, which
	// would make every CREATE DATABASE from it fail.
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+quote(s.template)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("testdb: mark template %s: %w", s.template, err)
	}
	return nil
}

// migrate applies the migrations to the database at dbURL, and closes every connection
// to it before it returns.
func migrate(ctx context.Context, dbURL string) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("testdb: connect to template: %w", err)
	}
	defer pool.Close()
	if err := store.Migrate(ctx, pool, &store.MigrateOpts{Logger: slog.New(slog.DiscardHandler)}); err != nil {
		return fmt.Errorf("testdb: migrate template: %w", err)
	}
	if err := riverschema.Migrate(ctx, pool, slog.New(slog.DiscardHandler)); err != nil {
		return fmt.Errorf("testdb: migrate template: %w", err)
	}
	return nil
}

// createDatabase creates a database, named after the test, from the template.
func (s *server) createDatabase(ctx context.Context, testName string) (string, error) {
	for {
		name, err := databaseName(testName)
		if err != nil {
			return "", err
		}
		_, err = s.admin.Exec(ctx, "CREATE DATABASE "+quote(name)+" TEMPLATE "+quote(s.template))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateDuplicateDatabase {
			continue // a random suffix met its twin: draw another
		}
		if err != nil {
			return "", fmt.Errorf("testdb: create database %s from %s: %w", name, s.template, err)
		}
		return name, nil
	}
}

// databaseURL returns the URL of the database name on the server.
func (s *server) databaseURL(name string) string {
	u := *s.adminURL
	u.Path, u.RawPath = "/"+name, ""
	return u.String()
}

// databaseName returns a new database name for a test: databasePrefix, the test's name
// cut down to lower-case letters, digits and underscores, and a random suffix, in at
// most maxIdentifierLen bytes.
func databaseName(testName string) (string, error) {
	suffix := make([]byte, suffixBytes)
	if _, err := rand.Read(suffix); err != nil {
		return "", fmt.Errorf("testdb: random database name: %w", err)
	}
	var b strings.Builder
	underscore := true // no leading underscore
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			underscore = false
		case !underscore:
			b.WriteByte('_')
			underscore = true
		}
	}
	base := strings.TrimSuffix(b.String(), "_")
	if limit := maxIdentifierLen - len(databasePrefix) - 1 - 2*suffixBytes; len(base) > limit {
		base = strings.TrimSuffix(base[:limit], "_")
	}
	return databasePrefix + base + "_" + hex.EncodeToString(suffix), nil
}

// quote quotes a database name as an SQL identifier.
func quote(name string) string {
	return pgx.Identifier{name}.Sanitize()
}

// ExamplePool returns a pool on a new database for an example function, which has
// no testing.TB, and the function that closes the pool and drops the database. It
// panics when the database cannot be made: an example cannot fail otherwise.
func ExamplePool(name string) (*pgxpool.Pool, func()) {
	ctx := context.Background()
	s, err := shared()
	if err != nil {
		panic(fmt.Sprintf("testdb: set up the test server: %v", err))
	}
	db, err := s.createDatabase(ctx, name)
	if err != nil {
		panic(err.Error())
	}
	pool, err := pgxpool.New(ctx, s.databaseURL(db))
	if err != nil {
		panic(err.Error())
	}
	return pool, func() {
		pool.Close()
		_, _ = s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+quote(db)+" WITH (FORCE)")
	}
}
