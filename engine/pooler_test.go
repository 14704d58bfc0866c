package engine_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/migrate"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

// The engine through PgBouncer in transaction mode, with two server
// connections for everything: migrations from several processes at once on
// an empty database, first attempts, River's jobs (polled), the sweeper and
// the retention job, and a process killed mid-operation whose operations are
// taken over by lease, or at once through a direct liveness connection.

// poolerDB creates an empty database on the test server, dropped at cleanup
// unless the test failed, and a PgBouncer in transaction mode with two server
// connections in front of the server. It returns the database's direct URL
// and its URL through PgBouncer.
func poolerDB(t *testing.T) (direct, pooled string) {
	t.Helper()
	ctx := t.Context()
	admin := testdb.AdminURL(t)
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "pooler_" + hex.EncodeToString(suffix)
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	direct = u.String()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept the database of the failed test: %s", direct)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		require.NoError(t, err)
		defer func() { _ = conn.Close(ctx) }()
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		require.NoError(t, err)
	})
	// Cleanups run last in, first out: PgBouncer stops before the drop.
	b := pgcluster.StartPgBouncerT(t, admin, &pgcluster.PgBouncerConfig{PoolSize: 2})
	return direct, b.URL(name)
}

// pooledPool opens a pool of up to maxConns connections on url, bounded for
// a pooler in transaction mode, closed at cleanup.
func pooledPool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	c, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	c.MaxConns = maxConns
	engine.BoundPool(c, &engine.PoolOpts{Pooler: true})
	pool, err := pgxpool.NewWithConfig(context.Background(), c)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestPooler: through PgBouncer in transaction mode (two server connections),
// four processes migrate an empty database at once, and an engine runs
// operations: first attempts, retries through River jobs, the retention job.
func TestPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pooled := poolerDB(t)

	own := store.MigrationSet{Name: "pooler_own", FS: fstest.MapFS{
		"1_a.sql": &fstest.MapFile{Data: []byte("CREATE TABLE pooler_a (x int);")},
		"2_b.sql": &fstest.MapFile{Data: []byte("ALTER TABLE pooler_a ADD COLUMN y int;")},
	}}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		pool := pooledPool(t, pooled, 4) // a process's
		wg.Go(func() {
			errs <- engine.Migrate(ctx, pool, nil)
			errs <- migrate.Apply(ctx, pool, own.Name, own.FS, "", nil)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	pool := pooledPool(t, pooled, 8)
	require.NoError(t, store.CheckSchema(ctx, pool, nil))
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT version FROM pooler_own_schema_version`).Scan(&version))
	require.Equal(t, 2, version)
	_, err := pool.Exec(ctx, scratchSchema)
	require.NoError(t, err)

	t.Run("RefusesStatementCache", func(t *testing.T) {
		plain, err := pgxpool.New(ctx, pooled)
		require.NoError(t, err)
		defer plain.Close()
		_, err = engine.New(plain, &engine.Config{Pooler: true})
		require.ErrorContains(t, err, "BoundPool and PoolOpts.Pooler")
	})

	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{Base: 10 * time.Millisecond})
	e, err := engine.New(pool, &engine.Config{
		Operations:        []engine.Definition{op},
		ControlPool:       pooledPool(t, pooled, 4),
		Pooler:            true,
		Lease:             2 * time.Second,
		SweepInterval:     50 * time.Millisecond,
		PollInterval:      20 * time.Millisecond,
		InlineRetryMax:    -1, // every retry through River
		Retention:         time.Millisecond,
		RetentionInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Stop(stopCtx))
	})

	const n = 20
	b.failPayout.Store(3) // three payouts fail once: retried by River jobs
	for i := range n {
		wg.Go(func() {
			_, err := engine.Start(ctx, e, op, "pooler", fmt.Sprintf("key-%d", i), transferIn{From: "a", To: "b", Amount: 10}, nil)
			require.NoError(t, err)
		})
	}
	wg.Wait()
	// Each operation succeeds exactly once, by the books: its row may be gone
	// by then (a retention of a millisecond), so it is not read back.
	want := books{ledgerRows: 2 * n, payouts: n, payoutCalls: n, finals: n}
	require.Eventually(t, func() bool { return readBooks(t, pool) == want }, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, want, readBooks(t, pool))
	// River's jobs, fetched by polling, ran the retries (and, when River's
	// scheduler promoted them after the lease, the sweeper's resumes).
	require.Eventually(t, func() bool {
		var jobs int
		return pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE kind = 'idemflow_resume' AND state = 'completed'`).Scan(&jobs) == nil && jobs >= 3
	}, 10*time.Second, 50*time.Millisecond, "a River job per retry at least")

	// The retention job (River's leader, elected by polling) deletes them.
	require.Eventually(t, func() bool {
		var left int
		return pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation`).Scan(&left) == nil && left == 0
	}, 30*time.Second, 50*time.Millisecond, "finished operations deleted by retention")
}

const (
	poolerEnvURL    = "IDEMFLOW_POOLER_TEST_URL"
	poolerEnvDirect = "IDEMFLOW_POOLER_TEST_DIRECT"
	poolerEnvLease  = "IDEMFLOW_POOLER_TEST_LEASE"
	poolerReached   = "POOLER PAYOUT MADE"
)

// TestPoolerChild is the process that TestPoolerTakeover kills: an engine
// through PgBouncer whose one transfer stays in its payout step once the
// payout is made. It does nothing unless that test started it.
func TestPoolerChild(t *testing.T) {
	pooled := os.Getenv(poolerEnvURL)
	if pooled == "" {
		t.Skip("run by TestPoolerTakeover only")
	}
	lease, err := time.ParseDuration(os.Getenv(poolerEnvLease))
	require.NoError(t, err)
	ctx := context.Background()
	pool := pooledPool(t, pooled, 4)
	cfg := &engine.Config{Lease: lease, Pooler: true}
	if direct := os.Getenv(poolerEnvDirect); direct != "" {
		cfg.Takeover.ConnConfig, err = pgx.ParseConfig(direct)
		require.NoError(t, err)
	}
	b := &bundle{pool: pool}
	made := func(ctx context.Context, at engine.Attempt, in transferIn, s *transferState) error {
		if err := b.payout(ctx, at, in, s); err != nil {
			return err
		}
		fmt.Println(poolerReached)
		time.Sleep(time.Hour) // until SIGKILL
		return nil
	}
	op, err := engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("ledger", ledger).Compensate(reverseLedger),
		engine.ExternalStep("payout", made).Lookup(b.lookupPayout).Window(0),
		engine.TxStep("finalize", finalize),
	}, func(in transferIn, s *transferState) (transferOut, error) { return transferOut(*s), nil }, nil)
	require.NoError(t, err)
	cfg.Operations = []engine.Definition{op}
	e, err := engine.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	_, _ = engine.Start(ctx, e, op, crashScope, crashKey, transferIn{From: "a", To: "b", Amount: 42}, nil)
	time.Sleep(time.Hour) // the first attempt runs on: until SIGKILL
}

// TestPoolerTakeover: a process that reaches the database through PgBouncer
// is killed (SIGKILL) once its payout is made. Another one through PgBouncer
// takes its operation over when its lease ends (the sweeper), or at once
// when both hold their liveness lock on a direct connection; the operation
// finishes exactly once, its payout found by the lookup.
func TestPoolerTakeover(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		direct     bool
		lease, max time.Duration
	}{
		{"ByLease", false, time.Second, 20 * time.Second},
		{"ByLivenessLock", true, time.Minute, 10 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			direct, pooled := poolerDB(t)
			pool := pooledPool(t, pooled, 8)
			require.NoError(t, engine.Migrate(ctx, pool, nil))
			_, err := pool.Exec(ctx, scratchSchema)
			require.NoError(t, err)
			env := []string{poolerEnvURL + "=" + pooled, poolerEnvLease + "=" + tt.lease.String()}
			cfg := &engine.Config{Lease: tt.lease, Pooler: true, SweepInterval: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond}
			if tt.direct {
				env = append(env, poolerEnvDirect+"="+direct)
				cfg.Takeover.ConnConfig, err = pgx.ParseConfig(direct)
				require.NoError(t, err)
			}
			child := startChild(t, "TestPoolerChild", env, poolerReached)
			require.NoError(t, child.Process.Kill())
			_ = child.Wait()
			killed := time.Now()

			b := &bundle{pool: pool}
			op := b.transferOp(t, engine.RetryPolicy{Base: 10 * time.Millisecond})
			cfg.Operations = []engine.Definition{op}
			e, err := engine.New(pool, cfg)
			require.NoError(t, err)
			require.NoError(t, e.StartWorkers(ctx))
			t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
			s, err := engine.Start(ctx, e, op, crashScope, crashKey, transferIn{From: "a", To: "b", Amount: 42}, nil)
			require.NoError(t, err)
			require.False(t, s.Created)
			waitCtx, cancel := context.WithTimeout(ctx, tt.max)
			defer cancel()
			info, err := s.Wait(waitCtx)
			require.NoError(t, err)
			require.Equal(t, engine.StatusSucceeded, info.Status)
			t.Logf("killed to finished: %s", time.Since(killed).Round(time.Millisecond))
			require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, pool))
			require.Zero(t, b.calls.Load(), "the lookup found the dead run's payout")
		})
	}
}
