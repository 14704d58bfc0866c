package engine_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
)

const (
	takeoverEnvURL   = "IDEMFLOW_TAKEOVER_TEST_URL"
	takeoverEnvLease = "IDEMFLOW_TAKEOVER_TEST_LEASE"
	takeoverEnvN     = "IDEMFLOW_TAKEOVER_TEST_N"
	takeoverReached  = "TAKEOVER POINT REACHED"
)

// startTakeoverChild runs TestTakeoverChild in a child process, with workers
// and the lease given, and returns it once it holds n transfers (keys
// crashKey, then crashKey-1...) in their payout step's call.
func startTakeoverChild(t testing.TB, url string, lease time.Duration, n int) *exec.Cmd {
	t.Helper()
	return startChild(t, "TestTakeoverChild", []string{
		takeoverEnvURL + "=" + url, takeoverEnvLease + "=" + lease.String(), fmt.Sprintf("%s=%d", takeoverEnvN, n),
	}, takeoverReached)
}

// TestTakeoverChild is the process that the takeover tests kill or stop. It
// does nothing unless one of them started it.
func TestTakeoverChild(t *testing.T) {
	url := os.Getenv(takeoverEnvURL)
	if url == "" {
		t.Skip("run by the takeover tests only")
	}
	lease, err := time.ParseDuration(os.Getenv(takeoverEnvLease))
	require.NoError(t, err)
	n, err := strconv.Atoi(os.Getenv(takeoverEnvN))
	require.NoError(t, err)
	var reached atomic.Int32
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	b := &bundle{pool: pool}
	op := b.transferOp(t, engine.RetryPolicy{})
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op},
		Lease:      lease,
		Faults: engine.Faults{Hook: func(ctx context.Context, ev faults.Event) error {
			if ev.Step == "payout" && ev.Point == faults.PointAfterEffect {
				if reached.Add(1) == int32(n) {
					fmt.Println(takeoverReached)
				}
				time.Sleep(time.Hour) // until SIGKILL, or SIGSTOP and then SIGKILL
			}
			return nil
		}},
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(ctx))
	for i := range n {
		go func() {
			_, _ = engine.Start(ctx, e, op, crashScope, takeoverKey(i), transferIn{From: "a", To: "b", Amount: 42}, nil)
		}()
	}
	time.Sleep(time.Hour)
}

// takeoverKey is the key of the child's transfer i.
func takeoverKey(i int) string {
	if i == 0 {
		return crashKey
	}
	return fmt.Sprintf("%s-%d", crashKey, i)
}

// takeoverEngine is the surviving process: workers, and the lease given.
func takeoverEngine(t *testing.T, pool *pgxpool.Pool, b *bundle, lease time.Duration) (*engine.Engine, *engine.Operation[transferIn, transferState, transferOut]) {
	t.Helper()
	op := b.transferOp(t, engine.RetryPolicy{Base: 10 * time.Millisecond})
	e, err := engine.New(pool, &engine.Config{
		Operations: []engine.Definition{op}, Lease: lease, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, e.StartWorkers(context.Background()))
	t.Cleanup(func() { require.NoError(t, e.Stop(context.Background())) })
	return e, op
}

// TestTakeover: a process killed in the middle of an operation loses it at
// once, not when its lease ends: with a lease of a minute, the surviving
// process finishes it within seconds, exactly once.
func TestTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := scratchDB(t)
	const lease = time.Minute
	b := &bundle{pool: pool}
	e, op := takeoverEngine(t, pool, b, lease)

	child := startTakeoverChild(t, url, lease, 1)
	killed := time.Now()
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()

	s, err := engine.Start(ctx, e, op, crashScope, crashKey, transferIn{From: "a", To: "b", Amount: 42}, nil)
	require.NoError(t, err)
	require.False(t, s.Created)
	waitCtx, cancel := context.WithTimeout(ctx, lease/2)
	defer cancel()
	info, err := s.Wait(waitCtx)
	require.NoError(t, err, "not taken over before half its lease")
	require.Equal(t, engine.StatusSucceeded, info.Status)
	t.Logf("killed to finished: %s", time.Since(killed).Round(time.Millisecond))
	require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, pool))
	require.Equal(t, int32(0), b.calls.Load(), "the lookup found the dead run's payout")
}

// TestTakeoverNotOfTheLiving: a process stopped (SIGSTOP) longer than a third
// of its lease is slow, not dead: its session, so its liveness lock, lives,
// and it keeps its operation until its lease ends; only then is it resumed.
func TestTakeoverNotOfTheLiving(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := scratchDB(t)
	const lease = 3 * time.Second
	b := &bundle{pool: pool}
	e, _ := takeoverEngine(t, pool, b, lease)

	child := startTakeoverChild(t, url, lease, 1)
	require.NoError(t, child.Process.Signal(syscall.SIGSTOP))
	before, err := e.GetByKey(ctx, crashScope, crashKey)
	require.NoError(t, err)
	stopped := time.Now()
	// Well past a third of the lease, and many takeover looks.
	time.Sleep(lease / 2)
	held, err := e.GetByKey(ctx, crashScope, crashKey)
	require.NoError(t, err)
	if time.Since(stopped) < lease {
		require.Equal(t, before.Runs, held.Runs, "taken from a live process before its lease ended")
		require.Equal(t, engine.StatusInProgress, held.Status)
	}
	// Its lease ends: the sweeper resumes it.
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	info, err := e.Wait(waitCtx, before.ID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.GreaterOrEqual(t, time.Since(stopped), lease-time.Second/2, "resumed when its lease ended, not before")
	require.Equal(t, books{ledgerRows: 2, payouts: 1, payoutCalls: 1, finals: 1}, readBooks(t, pool))
}

// BenchmarkTakeover: a process is killed (SIGKILL) while it holds 20 transfers
// in their payout call, with the default lease, and a second process with
// workers takes them over; it reports, over the transfers of all runs, how
// long each took from the kill to finished (p50, p99, max). Each run has a
// database and a child process of its own (outside the timer).
//
//	go test ./engine -run '^$' -bench Takeover -benchtime 20x
func BenchmarkTakeover(b *testing.B) {
	const perRun = 20
	ctx := context.Background()
	var took []time.Duration
	for range b.N {
		b.StopTimer()
		url := testdb.URL(b)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(b, err)
		_, err = pool.Exec(ctx, scratchSchema)
		require.NoError(b, err)
		bd := &bundle{pool: pool}
		op := bd.transferOp(b, engine.RetryPolicy{Base: 10 * time.Millisecond})
		e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}, PollInterval: 20 * time.Millisecond})
		require.NoError(b, err)
		require.NoError(b, e.StartWorkers(ctx))
		child := startTakeoverChild(b, url, defaultLease, perRun)
		var ids []uuid.UUID
		for i := range perRun {
			info, err := e.GetByKey(ctx, crashScope, takeoverKey(i))
			require.NoError(b, err)
			ids = append(ids, info.ID)
		}
		b.StartTimer()
		killed := time.Now()
		require.NoError(b, child.Process.Kill())
		done := make(chan time.Duration, perRun)
		for _, id := range ids {
			go func() {
				waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				info, err := e.Wait(waitCtx, id)
				if err != nil || info.Status != engine.StatusSucceeded {
					done <- -1
					return
				}
				done <- time.Since(killed)
			}()
		}
		for range perRun {
			d := <-done
			require.Positive(b, d, "a transfer did not finish")
			took = append(took, d)
		}
		b.StopTimer()
		_ = child.Wait()
		require.Equal(b, books{ledgerRows: 2 * perRun, payouts: perRun, payoutCalls: perRun, finals: perRun}, readBooks(b, pool))
		require.NoError(b, e.Stop(ctx))
		pool.Close()
		b.StartTimer()
	}
	slices.Sort(took)
	at := func(q float64) time.Duration { return took[min(len(took)-1, int(q*float64(len(took))))] }
	b.ReportMetric(float64(at(0.5).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(at(0.99).Milliseconds()), "p99-ms")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "max-ms")
}
