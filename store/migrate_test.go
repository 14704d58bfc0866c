package store_test

import (
	"context"
	"io/fs"
	"log/slog"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// TestMigrateAdoptsGoose: a database that goose migrated (as this package did
// before tern) continues from the version goose recorded, applying only what
// is newer, once.
func TestMigrateAdoptsGoose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	// The schema as goose left it at version 3: the migrations after it
	// undone (by their own down sections), goose's table, no tern table.
	latest := migrateTo(t, pool, 3)
	_, err := pool.Exec(ctx, `
		DROP TABLE idemflow_schema_version;
		CREATE TABLE idemflow_goose_version (id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
		INSERT INTO idemflow_goose_version (version_id, is_applied) VALUES (0, true), (1, true), (2, true), (3, true);`)
	require.NoError(t, err)
	require.ErrorIs(t, store.CheckSchema(ctx, pool, nil), store.ErrNotMigrated)

	require.NoError(t, store.Migrate(ctx, pool, nil))
	require.NoError(t, store.Migrate(ctx, pool, nil), "twice as well as once")
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemflow_schema_version`).Scan(&version))
	require.Equal(t, latest, version)
	var hasSecret bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'idemflow_operation' AND column_name = 'key_seed')`).Scan(&hasSecret))
	require.True(t, hasSecret, "migration 4 applied")
	require.NoError(t, store.CheckSchema(ctx, pool, nil))
}

// TestMigrateWithBoundedPool: a pool whose statements may wait 50 ms for a lock
// still migrates while another process holds the migration lock for longer
// (as a process of an earlier build held it, for its session): a migration's
// transaction lifts those bounds.
func TestMigrateWithBoundedPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := testdb.Pool(t)
	c := base.Config().Copy()
	c.ConnConfig.RuntimeParams["lock_timeout"] = "50"
	c.ConnConfig.RuntimeParams["statement_timeout"] = "100"
	bounded, err := pgxpool.NewWithConfig(ctx, c)
	require.NoError(t, err)
	defer bounded.Close()

	// Another process is migrating: it holds the lock for 500 ms.
	holder, err := base.Acquire(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(0x69_64_65_6d_73_63_68))
	require.NoError(t, err)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(500 * time.Millisecond) // what the other process's migration takes
		_, _ = holder.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(0x69_64_65_6d_73_63_68))
		holder.Release()
	}()
	require.NoError(t, store.Migrate(ctx, bounded, nil))
	<-released
}

// migrateTo migrates pool's database to idemflow's version, up or down, and
// returns the latest version.
func migrateTo(t *testing.T, pool *pgxpool.Pool, version int) int {
	t.Helper()
	require.NoError(t, migrator(t, pool).MigrateTo(context.Background(), version))
	files, err := fs.Glob(store.Migrations(), "*.sql")
	require.NoError(t, err)
	return len(files)
}

// testMigrator moves idemflow's migrations on a database, as Migrate does.
type testMigrator struct {
	pool *pgxpool.Pool
	set  store.MigrationSet
}

func migrator(t *testing.T, pool *pgxpool.Pool) *testMigrator {
	t.Helper()
	return &testMigrator{pool: pool, set: store.MigrationSet{Name: "idemflow", FS: store.Migrations()}}
}

// MigrateTo moves the schema to version, up or down.
func (m *testMigrator) MigrateTo(ctx context.Context, version int) error {
	return m.set.MigrateTo(ctx, m.pool, version, slog.New(slog.DiscardHandler))
}

// Migrate moves the schema up to the latest version.
func (m *testMigrator) Migrate(ctx context.Context) error {
	return m.set.Apply(ctx, m.pool, slog.New(slog.DiscardHandler))
}

// TestMigrateTwoAtOnce: two processes that start together from version 10
// both migrate without an error (one waits for the other's lock), through
// migration 13's index build: a CREATE INDEX CONCURRENTLY there would have
// waited for the other's wait on the lock, a deadlock.
func TestMigrateTwoAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	latest := migrateTo(t, pool, 10)
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- store.Migrate(ctx, pool, nil) }()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemflow_schema_version`).Scan(&version))
	require.Equal(t, latest, version)
}

// TestMigrationSetRefuses: files that the runner cannot apply as they say are
// refused before anything runs.
func TestMigrationSetRefuses(t *testing.T) {
	t.Parallel()
	file := func(sql string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(sql)} }
	for _, tt := range []struct {
		name string
		fsys fstest.MapFS
		err  string
	}{
		{"None", fstest.MapFS{"README": file("x")}, "no migration files"},
		{"Gap", fstest.MapFS{"1_a.sql": file("SELECT 1;"), "3_c.sql": file("SELECT 1;")}, "3_c.sql: no migration 2 before it"},
		{"Twice", fstest.MapFS{"1_a.sql": file("SELECT 1;"), "01_b.sql": file("SELECT 1;")}, "have the same version"},
		{"Zero", fstest.MapFS{"0_a.sql": file("SELECT 1;")}, "a number from 1"},
		{"NoSQL", fstest.MapFS{"1_a.sql": file("-- only a comment\n---- create above / drop below ----\nDROP TABLE t;")}, "no SQL above"},
		{"DisableTx", fstest.MapFS{"1_a.sql": file("---- tern: disable-tx ----\nCREATE INDEX CONCURRENTLY i ON t (a);")}, "disable-tx is not supported"},
		{"Template", fstest.MapFS{"1_a.sql": file("CREATE TABLE {{ .prefix }}t (a int);")}, "not Go templates"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := store.MigrationSet{Name: "refused", FS: tt.fsys}.Apply(context.Background(), nil, nil)
			require.ErrorContains(t, err, tt.err)
		})
	}
}

// TestMigrationSetUpAndDown: a set's migrations apply in order, each once,
// undo by their down sections to any version, and a SET in one does not
// outlive its transaction.
func TestMigrationSetUpAndDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	set := store.MigrationSet{Name: "updown", FS: fstest.MapFS{
		"migrations/001_a.sql": &fstest.MapFile{Data: []byte("CREATE TABLE updown_a (x int);\nSET search_path = nowhere;\n---- create above / drop below ----\nDROP TABLE updown_a;")},
		"migrations/002_b.sql": &fstest.MapFile{Data: []byte("CREATE TABLE updown_b (x int);\n---- create above / drop below ----\nDROP TABLE updown_b;")},
		"migrations/003_c.sql": &fstest.MapFile{Data: []byte("ALTER TABLE updown_b ADD COLUMN y int;")},
	}, Dir: "migrations"}
	discard := slog.New(slog.DiscardHandler)
	version := func() (v int) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM updown_schema_version`).Scan(&v))
		return v
	}
	exists := func(table string) (ok bool) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok))
		return ok
	}
	require.NoError(t, set.Apply(ctx, pool, discard))
	require.NoError(t, set.Apply(ctx, pool, discard), "twice as well as once")
	require.Equal(t, 3, version())
	var path string
	require.NoError(t, pool.QueryRow(ctx, `SHOW search_path`).Scan(&path))
	require.NotEqual(t, "nowhere", path)

	require.ErrorContains(t, set.MigrateTo(ctx, pool, 2, discard), "003_c.sql cannot be undone")
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(new(int)), "the pool serves on")
	_, err := pool.Exec(ctx, `ALTER TABLE updown_b DROP COLUMN y; UPDATE updown_schema_version SET version = 2`)
	require.NoError(t, err)
	require.NoError(t, set.MigrateTo(ctx, pool, 0, discard))
	require.Equal(t, 0, version())
	require.False(t, exists("updown_a"))
	require.False(t, exists("updown_b"))
	require.NoError(t, set.MigrateTo(ctx, pool, 1, discard))
	require.True(t, exists("updown_a"))
	require.False(t, exists("updown_b"))
	require.Error(t, set.MigrateTo(ctx, pool, 4, discard))
}
