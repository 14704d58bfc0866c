package testdb

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// insertOperation writes a row that names the test that wrote it.
func insertOperation(t *testing.T, pool *pgxpool.Pool, key string) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		INSERT INTO idemflow_operation (id, name, scope, key, steps, input, locked_until, format)
		VALUES (gen_random_uuid(), 'isolation', 'testdb', $1, '{}', '{}', now(), 2)`, key)
	require.NoError(t, err)
}

// operationKeys returns the keys of every operation in the database.
func operationKeys(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT key FROM idemflow_operation ORDER BY key")
	require.NoError(t, err)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return keys
}

// databaseExists reports whether the server has a database called name.
func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), AdminURL(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(t.Context())) }()
	var exists bool
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
	return exists
}

// databaseOf returns the database name in a URL that testdb returned.
func databaseOf(t *testing.T, dbURL string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	return cfg.Database
}

// TestDatabasesAreIsolated has two parallel tests each write a row to its database
// while the other runs, then check that each sees its own row and not the other's.
func TestDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	if p := flag.Lookup("test.parallel"); p != nil && p.Value.String() == "1" {
		t.Skip("the two subtests must run at the same time: needs -parallel 2 or more")
	}
	names := []string{"first", "second"}
	written := map[string]chan struct{}{}
	databases := map[string]string{} // written before written[name] is closed
	for _, name := range names {
		written[name] = make(chan struct{})
	}
	for i, name := range names {
		other := names[1-i]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var once sync.Once
			signal := func() { once.Do(func() { close(written[name]) }) }
			defer signal() // on failure too, so that the other does not wait in vain

			pool := Pool(t)
			var database string
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT current_database()").Scan(&database))
			databases[name] = database
			require.Empty(t, operationKeys(t, pool), "a new database holds no rows")
			insertOperation(t, pool, name)
			signal()

			select {
			case <-written[other]:
			case <-time.After(time.Minute): // a guard against a hang, not a timed assertion
				t.Fatalf("%s did not write its row", other)
			}
			require.NotEqual(t, databases[other], database)
			require.Equal(t, []string{name}, operationKeys(t, pool), "sees its own row and not %s's", other)
		})
	}
}

func TestPoolIsMigrated(t *testing.T) {
	t.Parallel()
	pool := Pool(t)
	var schemaVersion, riverVersion int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT version FROM idemflow_schema_version").Scan(&schemaVersion))
	require.Positive(t, schemaVersion)
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT max(version) FROM river_migration").Scan(&riverVersion))
	require.Positive(t, riverVersion)
	var jobs, steps int
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT (SELECT count(*) FROM river_job), (SELECT count(*) FROM idemflow_step_recorded)").Scan(&jobs, &steps))
	require.Zero(t, jobs)
	require.Zero(t, steps)
}

func TestTemplateIsClosed(t *testing.T) {
	t.Parallel()
	s := sharedServer(t)
	conn, err := pgx.Connect(t.Context(), AdminURL(t))
	require.NoError(t, err)
	defer func() { require.NoError(t, conn.Close(t.Context())) }()
	var isTemplate, allowConn bool
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT datistemplate, datallowconn FROM pg_database WHERE datname = $1", s.template).Scan(&isTemplate, &allowConn))
	require.True(t, isTemplate)
	require.False(t, allowConn, "nobody can hold the template open")
	require.True(t, strings.HasPrefix(s.template, templatePrefix))
}

// cleanupTB records what URL and Pool register, so that their cleanup can be run, and
// the test's outcome chosen, within a test.
type cleanupTB struct {
	testing.TB
	failed   bool
	cleanups []func()
	logs     []string
}

func (tb *cleanupTB) Cleanup(f func())           { tb.cleanups = append(tb.cleanups, f) }
func (tb *cleanupTB) Failed() bool               { return tb.failed }
func (tb *cleanupTB) Logf(f string, args ...any) { tb.logs = append(tb.logs, fmt.Sprintf(f, args...)) }

// runCleanups runs the cleanups last in, first out, as testing does.
func (tb *cleanupTB) runCleanups() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}

func TestCleanup(t *testing.T) {
	t.Parallel()

	t.Run("DropsDatabaseOfPassedTest", func(t *testing.T) {
		t.Parallel()
		tb := &cleanupTB{TB: t}
		pool := Pool(tb)
		name := databaseOf(t, pool.Config().ConnString())
		require.True(t, databaseExists(t, name))
		tb.runCleanups() // closes the pool, then drops the database
		require.Zero(t, pool.Stat().TotalConns(), "pool closed")
		require.False(t, databaseExists(t, name))
		require.Empty(t, tb.logs)
	})

	t.Run("KeepsDatabaseOfFailedTest", func(t *testing.T) {
		t.Parallel()
		tb := &cleanupTB{TB: t}
		dbURL := URL(tb)
		name := databaseOf(t, dbURL)
		t.Cleanup(func() {
			_, err := sharedServer(t).admin.Exec(context.WithoutCancel(t.Context()), "DROP DATABASE "+quote(name)+" WITH (FORCE)")
			require.NoError(t, err)
		})
		tb.failed = true
		tb.runCleanups()
		require.True(t, databaseExists(t, name))
		require.Len(t, tb.logs, 1)
		require.Contains(t, tb.logs[0], dbURL)
	})
}

func TestDatabaseName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		testName string
		wantBase string
	}{
		{"TestX", "t_testx_"},
		{"TestCleanup/DropsDatabaseOfPassedTest", "t_testcleanup_dropsdatabaseofpassedtest_"},
		{"Test/ü ñ--weird__name#01", "t_test_weird_name_01_"},
		{"__", "t__"},
		{strings.Repeat("TestLong/", 20), "t_" + strings.Repeat("testlong_", 5) + "tes_"},
	} {
		t.Run(tt.testName, func(t *testing.T) {
			t.Parallel()
			a, err := databaseName(tt.testName)
			require.NoError(t, err)
			b, err := databaseName(tt.testName)
			require.NoError(t, err)
			require.NotEqual(t, a, b, "random suffix")
			require.LessOrEqual(t, len(a), maxIdentifierLen)
			require.Regexp(t, `^[a-z0-9_]+$`, a)
			require.True(t, strings.HasPrefix(a, tt.wantBase), "%q starts with %q", a, tt.wantBase)
			require.Len(t, a, len(tt.wantBase)+2*suffixBytes)
		})
	}
}
