package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
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
	require.ErrorIs(t, store.CheckSchema(ctx, pool), store.ErrNotMigrated)

	require.NoError(t, store.Migrate(ctx, pool, nil))
	require.NoError(t, store.Migrate(ctx, pool, nil), "twice as well as once")
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM idemflow_schema_version`).Scan(&version))
	require.Equal(t, latest, version)
	var hasSecret bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'idemflow_operation' AND column_name = 'key_seed')`).Scan(&hasSecret))
	require.True(t, hasSecret, "migration 4 applied")
	require.NoError(t, store.CheckSchema(ctx, pool))
}

// TestMigrateWithBoundedPool: a pool whose statements may wait 50 ms for a lock
// still migrates while another process holds the migration lock for longer:
// migrations run on connections of their own, without those bounds.
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

// migrateTo migrates pool's database to idemflow's version, up or down, with
// tern as Migrate does, and returns the latest version.
func migrateTo(t *testing.T, pool *pgxpool.Pool, version int) int {
	t.Helper()
	m := migrator(t, pool)
	require.NoError(t, m.MigrateTo(context.Background(), int32(version)))
	return len(m.Migrations)
}

// migrator returns tern's migrator of idemflow's migrations on a connection of
// pool that it holds until the test ends, as Migrate uses them.
func migrator(t *testing.T, pool *pgxpool.Pool) *migrate.Migrator {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	m, err := migrate.NewMigrator(ctx, conn.Conn(), "idemflow_schema_version")
	require.NoError(t, err)
	require.NoError(t, m.LoadMigrations(store.Migrations()))
	return m
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
