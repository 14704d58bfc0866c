package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/reconcile"
)

// TestFailover: a primary with a synchronous standby, the engine connected to
// both by a multi-host URL that wants the one that accepts writes, with the
// default lease. Under transfers, the primary is killed (SIGKILL) and the
// standby promoted 6 s later: the engine serves again by itself, a start told
// "unavailable" is retried with its key, and every transfer finishes exactly
// once, with the books right. No transfer in flight at the kill waits out its
// lease: the process, alive, resumes its own runs as soon as the new primary
// accepts writes (stranded.go), so each finishes within a few seconds of the
// promotion, not a lease after it.
func TestFailover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := pgcluster.Replicated(t, true)

	cfg, err := pgxpool.ParseConfig(pgcluster.MultiHostURL(primary, standby, "postgres"))
	require.NoError(t, err)
	engine.BoundPool(cfg, nil)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, engine.Migrate(ctx, pool, nil))
	_, err = pool.Exec(ctx, scratchSchema)
	require.NoError(t, err)

	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{Base: 50 * time.Millisecond, Cap: time.Second, MaxAttempts: 1000})
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op}, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = e.Stop(stopCtx)
	})

	// Clients: each starts its transfer, and retries it with the same key
	// while the start is refused as unavailable, until it has finished.
	const clients = 40
	var unavailable atomic.Int32
	var wg sync.WaitGroup
	results := make([]*engine.Info, clients)
	errs := make([]error, clients)
	// sent is when each client first asked for its transfer; finished, when
	// it saw it finished.
	sent, finished := make([]time.Time, clients), make([]time.Time, clients)
	killAfter := make(chan struct{})
	var started atomic.Int32
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("failover-%d", i)
			sent[i] = time.Now()
			deadline := time.Now().Add(90 * time.Second)
			for time.Now().Before(deadline) {
				s, err := engine.Start(ctx, e, op, "client", key, transferIn{From: "a", To: "b", Amount: int64(i + 1)}, nil)
				if engine.IsUnavailable(err) {
					unavailable.Add(1)
					time.Sleep(100 * time.Millisecond) // the client's pause before it retries
					continue
				}
				if err != nil {
					errs[i] = err
					return
				}
				if started.Add(1) == clients/4 {
					close(killAfter)
				}
				wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				results[i], errs[i] = s.Wait(wctx)
				cancel()
				if errs[i] != nil && engine.IsUnavailable(errs[i]) {
					continue // reading the operation failed with the primary: ask again
				}
				finished[i] = time.Now()
				return
			}
			errs[i] = fmt.Errorf("key %s: not finished in time", key)
		}()
	}
	select {
	case <-killAfter:
	case <-time.After(60 * time.Second):
		t.Fatal("the transfers did not start")
	}
	require.NoError(t, primary.Kill(ctx))
	killed := time.Now()
	// A failover manager takes a while to promote (Patroni: two of its
	// loops, or its ttl when the node is lost): longer than the engine looks
	// for a reservation whose answer was lost (5 s), and long enough for
	// every run that was working to stop without the database.
	time.Sleep(6 * time.Second)
	require.NoError(t, standby.Promote(ctx))
	promoted := time.Now()
	t.Logf("primary killed; standby promoted after %s", promoted.Sub(killed).Round(time.Millisecond))
	wg.Wait()
	t.Logf("starts answered unavailable meanwhile: %d", unavailable.Load())

	// In flight at the kill: asked for before it, not finished by then.
	var after []time.Duration
	for i := range clients {
		require.NoError(t, errs[i], "client %d", i)
		require.Equal(t, engine.StatusSucceeded, results[i].Status, "client %d", i)
		if sent[i].Before(killed) && finished[i].After(killed) {
			after = append(after, finished[i].Sub(promoted))
		}
	}
	require.NotEmpty(t, after, "no transfer was in flight at the kill")
	slices.Sort(after)
	pick := func(q float64) time.Duration { return after[int(q*float64(len(after)-1))].Round(time.Millisecond) }
	t.Logf("transfers in flight at the kill: %d; finished after the promotion: median %s, p90 %s, slowest %s (lease %s)",
		len(after), pick(0.5), pick(0.9), pick(1), defaultLease)
	// A bound on the takeover, not a speed: a transfer that waited out its
	// lease would finish about 15 s after the kill.
	require.Less(t, after[len(after)-1], 5*time.Second, "a transfer in flight at the kill waited for its lease")
	got := readBooks(t, pool)
	require.Equal(t, 2*clients, got.ledgerRows, "one ledger move per transfer")
	require.Zero(t, got.reversals)
	require.Equal(t, clients, got.payouts, "one payout per transfer")
	require.Equal(t, clients, got.finals)
	var ops int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation WHERE state = 'succeeded'`).Scan(&ops))
	require.Equal(t, clients, ops)
}

// TestAsyncStandbyLossCaught: with an asynchronous standby, a failover can lose
// commits the primary acknowledged: here the standby's WAL receiver is
// stopped while transfers finish on the primary, the primary is killed and the
// standby promoted. The transfers are gone from the books, but not from the
// provider: reconciliation reports each of its payouts under a key that no
// operation holds (reconcile.UnknownKey). What the README says of durability is
// why: run with synchronous_commit on and a synchronous standby.
func TestAsyncStandbyLossCaught(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	primary, standby := pgcluster.Replicated(t, false)

	pool, err := pgxpool.New(ctx, pgcluster.MultiHostURL(primary, standby, "postgres"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, engine.Migrate(ctx, pool, nil))
	_, err = pool.Exec(ctx, scratchSchema)
	require.NoError(t, err)
	// Everything so far has reached the standby.
	require.Eventually(t, func() bool {
		var lag *int64
		err := pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - replay_lsn)::bigint FROM pg_stat_replication`).Scan(&lag)
		return err == nil && lag != nil && *lag == 0
	}, 30*time.Second, 50*time.Millisecond)

	// The provider keeps its records outside the database, as a real one does.
	var mu sync.Mutex
	paid := map[string]reconcile.Record{}
	op, err := engine.NewOperation("payout", []engine.Step[int64, string]{
		engine.ExternalStep("pay", func(_ context.Context, at engine.Attempt, amount int64, s *string) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := paid[at.Key]; !ok {
				paid[at.Key] = reconcile.Record{Key: at.Key, Reference: fmt.Sprintf("po_%d", len(paid)+1), Amount: amount, CreatedAt: time.Now()}
			}
			*s = paid[at.Key].Reference
			return nil
		}),
	}, func(_ int64, s *string) (string, error) { return *s, nil }, nil)
	require.NoError(t, err)
	bank := reconcile.Source{Name: "bank", List: func(context.Context, reconcile.ListRequest) ([]reconcile.Record, string, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []reconcile.Record
		for _, r := range paid {
			out = append(out, r)
		}
		return out, "", nil
	}}
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op}, PollInterval: 20 * time.Millisecond,
		Reconcile: reconcile.Config{Sources: []reconcile.Source{bank}, Interval: -1},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })

	// The primary stops sending: whatever commits now is on the primary only.
	var sender int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&sender))
	require.NoError(t, syscall.Kill(sender, syscall.SIGSTOP))
	const transfers = 5
	for i := range transfers {
		s, err := engine.Start(ctx, e, op, "client", fmt.Sprintf("lost-%d", i), int64(100+i), nil)
		require.NoError(t, err)
		info, err := s.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, engine.StatusSucceeded, info.Status, "acknowledged by the primary")
	}
	require.NoError(t, primary.Kill(ctx))
	require.NoError(t, syscall.Kill(sender, syscall.SIGKILL))
	require.NoError(t, standby.Promote(ctx))

	var rep *engine.ReconcileReport
	require.Eventually(t, func() bool {
		rep, err = e.Reconcile(ctx, "bank")
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the engine did not serve again on the promoted standby: %v", err)
	var ops int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_operation`).Scan(&ops))
	require.Zero(t, ops, "the asynchronous standby lost the acknowledged transfers")
	require.Len(t, rep.Mismatches, transfers, "each lost transfer's payout is caught")
	for _, m := range rep.Mismatches {
		require.Equal(t, reconcile.UnknownKey, m.Kind)
	}
}
