package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDataDir returns the data directory of the cluster that this module's tests share:
// idemflow-test-pg under os.TempDir(). Package testdb starts it; the command pgtestctl
// stops it.
func TestDataDir() string {
	return filepath.Join(os.TempDir(), "idemflow-test-pg")
}

// TestClusterConfig returns the configuration of the cluster that this module's tests
// share: TestDataDir, with durability turned off (fsync, synchronous_commit,
// full_page_writes), which tests do not need and which costs them time. Benchmarks use a
// cluster of their own, configured like production.
func TestClusterConfig() *Config {
	return &Config{
		DataDir: TestDataDir(),
		Settings: map[string]string{
			"fsync":              "off",
			"synchronous_commit": "off",
			"full_page_writes":   "off",
		},
	}
}

// StartReplicated starts, under dir, a primary and a streaming standby of it,
// for failover tests: synchronous when synchronous is set (the primary waits
// for the standby to have each commit; it returns once the standby is), else
// asynchronous. Stop both when done; Kill the primary and Promote the standby
// to fail over.
func StartReplicated(ctx context.Context, dir string, synchronous bool) (primary, standby *Cluster, err error) {
	settings := map[string]string{"fsync": "off", "max_connections": "100", "wal_level": "replica", "max_wal_senders": "5"}
	primary, err = Ensure(ctx, &Config{DataDir: filepath.Join(dir, "primary"), Settings: settings, OpenParents: true})
	if err != nil {
		return nil, nil, err
	}
	standby, err = Ensure(ctx, &Config{DataDir: filepath.Join(dir, "standby"), Settings: settings, OpenParents: true, StandbyOf: primary.URL("postgres")})
	if err != nil {
		_ = primary.Stop(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	if !synchronous {
		return primary, standby, nil
	}
	conn, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err == nil {
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		_, err = conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = '*'`)
	}
	if err == nil {
		_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	}
	for err == nil {
		var n int
		if err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&n); err != nil || n == 1 {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err != nil {
		_ = standby.Stop(context.WithoutCancel(ctx))
		_ = primary.Stop(context.WithoutCancel(ctx))
		return nil, nil, fmt.Errorf("pgcluster: make the standby synchronous: %w", err)
	}
	return primary, standby, nil
}

// MultiHostURL is a URL for database on primary and standby that connects to
// whichever accepts writes (target_session_attrs=read-write).
func MultiHostURL(primary, standby *Cluster, database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		Superuser, primary.Port(), standby.Port(), database)
}

// Replicated is StartReplicated for a test, under its own temporary
// directory: it skips the test in -short mode or without the server's
// binaries, fails it when the pair does not start, and stops both at cleanup.
func Replicated(t testing.TB, synchronous bool) (primary, standby *Cluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts two PostgreSQL servers")
	}
	if _, err := BinDir(); err != nil {
		t.Skip("no PostgreSQL server binaries")
	}
	primary, standby, err := StartReplicated(context.Background(), t.TempDir(), synchronous)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = standby.Stop(context.Background())
		_ = primary.Stop(context.Background())
	})
	return primary, standby
}
