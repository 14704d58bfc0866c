package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// The environment variables that change BenchmarkWaitsIdle's defaults.
const (
	// waitsBenchWaitingEnv: how many operations wait in the second phase
	// (half on a signal, half on a timer). Defaults to 10,000.
	waitsBenchWaitingEnv = "IDEMFLOW_BENCH_WAITS_WAITING"
	// waitsBenchWindowEnv: how long each idle window is measured, as
	// time.ParseDuration reads it. Defaults to 60s (the retention job runs
	// once a minute: each window holds one run).
	waitsBenchWindowEnv = "IDEMFLOW_BENCH_WAITS_WINDOW"
	// waitsBenchTimersEnv: how many timers' latency each phase measures.
	// Defaults to 200.
	waitsBenchTimersEnv = "IDEMFLOW_BENCH_WAITS_TIMERS"
)

// BenchmarkWaitsIdle measures what waiting operations cost an idle engine,
// and how late a timer fires beside them. One engine with its workers and
// the default configuration (but MaxInFlight 64, which bounds only the
// setup's first attempts) runs on a fresh database; in two phases, with no
// operation waiting, then with 10,000 waiting (half on a SignalStep with no
// deadline, half on a TimerStep 30 days ahead, started through Start), it
// measures an idle window of 60 s:
//
//   - stmts/s: the statements the engine's pool sent (the engine's and
//     River's, counted by a pgx tracer; BEGIN, COMMIT and ROLLBACK apart, as
//     txctl/s);
//   - xacts/s: the database's transactions (pg_stat_database: xact_commit +
//     xact_rollback of this database, this benchmark's two reads of the
//     statistics included);
//   - rows/s: the rows that scans of the tables read (pg_stat_user_tables:
//     seq_tup_read + idx_tup_fetch), which a statement that reads the
//     waiting operations would make grow with them; and buffers/s
//     (pg_stat_database: blks_hit + blks_read);
//
// then the latency of 200 timers (TimerSteps whose moments are spread over
// the 2 s that begin 3 s after they are started): the checkpoint's finished
// time of each timer step less its moment (both on this machine's clock), p50,
// p90 and max. With -v it logs the statements and the tables' rows by name in
// each window. The environment variables IDEMFLOW_BENCH_WAITS_WAITING,
// _WINDOW and _TIMERS change the defaults. docs/benchmarks.md has its figures.
//
//	go test ./engine -run '^$' -bench WaitsIdle -benchtime 1x -timeout 30m -v
func BenchmarkWaitsIdle(b *testing.B) {
	waiting := benchEnvInt(b, waitsBenchWaitingEnv, 10_000)
	timers := benchEnvInt(b, waitsBenchTimersEnv, 200)
	window := 60 * time.Second
	if v := os.Getenv(waitsBenchWindowEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(b, err, "%s", waitsBenchWindowEnv)
		window = d
	}
	wb := newWaitsBench(b)
	ctx := context.Background()

	// The engine's start (River's election, its first maintenance) settles.
	wb.settle(ctx, 15*time.Second)
	idle0 := wb.idle(ctx, window)
	lat0 := wb.timerLatency(ctx, "w0", timers)

	created := time.Now()
	wb.startWaiting(ctx, waiting)
	b.Logf("%d operations started and waiting in %s", waiting, time.Since(created).Round(time.Second))
	wb.settle(ctx, 15*time.Second)
	idle1 := wb.idle(ctx, window)
	lat1 := wb.timerLatency(ctx, "w1", timers)
	wb.requireWaiting(ctx, waiting/2, waiting-waiting/2)

	b.StopTimer()
	for _, p := range []struct {
		label string
		idle  idleFigures
		lat   latencies
	}{{"waiting=0", idle0, lat0}, {fmt.Sprintf("waiting=%d", waiting), idle1, lat1}} {
		b.Logf("%s: %.1f stmts/s, %.1f txctl/s, %.1f xacts/s, %.0f rows/s, %.0f buffers/s; timers: p50 %s, p90 %s, max %s (n %d)",
			p.label, p.idle.stmts, p.idle.txControl, p.idle.xacts, p.idle.rows, p.idle.buffers,
			p.lat.p(0.5), p.lat.p(0.9), p.lat.max(), len(p.lat))
		b.ReportMetric(p.idle.stmts, "stmts/s-"+p.label)
		b.ReportMetric(p.idle.xacts, "xacts/s-"+p.label)
		b.ReportMetric(p.idle.rows, "rows/s-"+p.label)
		b.ReportMetric(float64(p.lat.p(0.5).Milliseconds()), "timer-p50-ms-"+p.label)
		b.ReportMetric(float64(p.lat.max().Milliseconds()), "timer-max-ms-"+p.label)
	}
	b.Logf("statements per second by name (waiting=0 | waiting=%d), and their time in ms per second:", waiting)
	for _, name := range slices.Sorted(maps.Keys(mergeKeys(idle0.byName, idle1.byName))) {
		a, c := idle0.byName[name], idle1.byName[name]
		b.Logf("  %-40s %7.2f | %7.2f   %6.2f | %6.2f ms/s", name, a.n, c.n, a.ms, c.ms)
	}
	b.Logf("rows read per second by table (waiting=0 | waiting=%d):", waiting)
	for _, name := range slices.Sorted(maps.Keys(mergeKeys(idle0.rowsByTable, idle1.rowsByTable))) {
		b.Logf("  %-40s %9.1f | %9.1f", name, idle0.rowsByTable[name], idle1.rowsByTable[name])
	}
}

// waitsBench is BenchmarkWaitsIdle's engine, its pools and its operations.
type waitsBench struct {
	b *testing.B
	e *engine.Engine
	// side reads the statistics, untraced.
	side    *pgxpool.Pool
	counter *stmtCounter
	// signal and timer are the operations that wait; at, the timers whose
	// latency is measured.
	signal, timer *engine.Operation[int, int, int]
	at            *engine.Operation[time.Time, int, int]
}

func newWaitsBench(b *testing.B) *waitsBench {
	ctx := context.Background()
	url := testdb.URL(b)
	wb := &waitsBench{b: b, counter: &stmtCounter{stats: map[string]*stmtStat{}}}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(b, err)
	cfg.MaxConns = 20
	cfg.ConnConfig.Tracer = wb.counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	wb.side, err = pgxpool.New(ctx, url)
	require.NoError(b, err)
	b.Cleanup(wb.side.Close)

	result := func(in int, _ *int) (int, error) { return in, nil }
	wb.signal, err = engine.NewOperation("wait_signal", []engine.Step[int, int]{
		engine.SignalStep("word", "go", func(context.Context, engine.Tx, engine.Attempt, int, *int, engine.Signal) error { return nil }),
	}, result, nil)
	require.NoError(b, err)
	wb.timer, err = engine.NewOperation("wait_timer", []engine.Step[int, int]{
		engine.TimerStep("release", func(int, *int) engine.Deadline { return engine.Deadline{After: 30 * 24 * time.Hour} }),
	}, result, nil)
	require.NoError(b, err)
	wb.at, err = engine.NewOperation("wait_at", []engine.Step[time.Time, int]{
		engine.TimerStep("at", func(at time.Time, _ *int) engine.Deadline { return engine.Deadline{At: at} }),
	}, func(time.Time, *int) (int, error) { return 0, nil }, nil)
	require.NoError(b, err)

	wb.e, err = engine.New(pool, &engine.Config{
		Operations:  []engine.Definition{wb.signal, wb.timer, wb.at},
		Logger:      slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		MaxInFlight: 64,
	})
	require.NoError(b, err)
	require.NoError(b, wb.e.StartWorkers(ctx))
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = wb.e.Stop(ctx)
	})
	return wb
}

// settle vacuums and analyzes the tables, so that autovacuum has nothing to
// do in the window that follows, and waits for d.
func (wb *waitsBench) settle(ctx context.Context, d time.Duration) {
	_, err := wb.side.Exec(ctx, "VACUUM ANALYZE")
	require.NoError(wb.b, err)
	time.Sleep(d)
}

// idleFigures are an idle window's rates, per second.
type idleFigures struct {
	stmts, txControl, xacts, rows, buffers float64
	byName                                 map[string]stmtRate
	rowsByTable                            map[string]float64
}

type stmtRate struct{ n, ms float64 }

// serverStats are the database's counters that idle reads.
type serverStats struct {
	xacts, buffers int64
	rows           map[string]int64
}

func (wb *waitsBench) serverStats(ctx context.Context) serverStats {
	var s serverStats
	require.NoError(wb.b, wb.side.QueryRow(ctx, `
		SELECT xact_commit + xact_rollback, blks_hit + blks_read
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.xacts, &s.buffers))
	rows, err := wb.side.Query(ctx, `
		SELECT relname::text, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables`)
	require.NoError(wb.b, err)
	s.rows = map[string]int64{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { s.rows[name] = n; return nil })
	require.NoError(wb.b, err)
	return s
}

// idle measures the engine, left alone, for d.
func (wb *waitsBench) idle(ctx context.Context, d time.Duration) idleFigures {
	before, stmts0 := wb.serverStats(ctx), wb.counter.snapshot()
	start := time.Now()
	time.Sleep(d)
	after, stmts1 := wb.serverStats(ctx), wb.counter.snapshot()
	secs := time.Since(start).Seconds()
	f := idleFigures{
		xacts:       float64(after.xacts-before.xacts) / secs,
		buffers:     float64(after.buffers-before.buffers) / secs,
		byName:      map[string]stmtRate{},
		rowsByTable: map[string]float64{},
	}
	for name, n := range after.rows {
		if r := float64(n-before.rows[name]) / secs; r > 0 {
			f.rowsByTable[name] = r
			f.rows += r
		}
	}
	for name, s := range stmts1 {
		n := float64(s.n-stmts0[name].n) / secs
		if n == 0 {
			continue
		}
		f.byName[name] = stmtRate{n: n, ms: float64((s.d - stmts0[name].d).Microseconds()) / 1000 / secs}
		if txControl[name] {
			f.txControl += n
		} else {
			f.stmts += n
		}
	}
	return f
}

// startWaiting starts n operations that wait, half for a signal and half for
// a moment 30 days ahead, and returns once they all wait.
func (wb *waitsBench) startWaiting(ctx context.Context, n int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				op := wb.signal
				if i%2 == 1 {
					op = wb.timer
				}
				for {
					_, err := engine.Start(ctx, wb.e, op, "bench", "waiting-"+strconv.Itoa(i), i, nil)
					if errors.Is(err, engine.ErrOverloaded) {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	require.NoError(wb.b, <-errs)
	wb.requireWaiting(ctx, n-n/2, n/2)
}

// requireWaiting waits up to a minute until signals operations wait for a
// signal and timers for a moment.
func (wb *waitsBench) requireWaiting(ctx context.Context, signals, timers int) {
	deadline := time.Now().Add(time.Minute)
	for {
		stats, err := wb.e.InProgress(ctx)
		require.NoError(wb.b, err)
		got := map[engine.WaitReason]int64{}
		for _, s := range stats {
			for r, n := range s.Waiting {
				got[r] += n
			}
		}
		if got[engine.WaitSignal] == int64(signals) && got[engine.WaitTimer] == int64(timers) {
			return
		}
		if time.Now().After(deadline) {
			wb.b.Fatalf("waiting: %v, want %d on signals and %d on timers", got, signals, timers)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// latencies are timers' lateness, sorted.
type latencies []time.Duration

func (l latencies) p(q float64) time.Duration { return l[min(int(q*float64(len(l))), len(l)-1)] }

func (l latencies) max() time.Duration { return l[len(l)-1] }

// timerLatency starts n operations whose timer steps' moments are spread
// over the 2 s that begin 3 s from now, waits for them, and returns how late
// each step passed: its checkpoint's finished time less its moment.
func (wb *waitsBench) timerLatency(ctx context.Context, prefix string, n int) latencies {
	base := time.Now().Add(3 * time.Second)
	moments := make([]time.Time, n)
	started := make([]*engine.Started, n)
	for i := range n {
		moments[i] = base.Add(time.Duration(i) * 2 * time.Second / time.Duration(n))
		s, err := engine.Start(ctx, wb.e, wb.at, "bench", prefix+"-"+strconv.Itoa(i), moments[i], nil)
		require.NoError(wb.b, err)
		started[i] = s
	}
	require.True(wb.b, time.Now().Before(base), "the timers were started after their first moment")
	out := make(latencies, n)
	for i, s := range started {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := s.Wait(wctx)
		cancel()
		require.NoError(wb.b, err)
		info, err := wb.e.Get(ctx, s.ID)
		require.NoError(wb.b, err)
		require.Equal(wb.b, engine.StatusSucceeded, info.Status)
		require.NotNil(wb.b, info.Steps[0].FinishedAt)
		out[i] = info.Steps[0].FinishedAt.Sub(moments[i])
	}
	slices.Sort(out)
	return out
}

// txControl are the names stmtCounter gives BEGIN, COMMIT and ROLLBACK.
var txControl = map[string]bool{"BEGIN": true, "COMMIT": true, "ROLLBACK": true}

// stmtCounter is a pgx tracer that counts the statements a pool sends, by
// sqlc query name (or, for SQL without one, its first word upper-cased), and
// their time (a batch's statements are counted, with no time).
type stmtCounter struct {
	mu    sync.Mutex
	stats map[string]*stmtStat
}

type stmtStat struct {
	n int64
	d time.Duration
}

var (
	_ pgx.QueryTracer = (*stmtCounter)(nil)
	_ pgx.BatchTracer = (*stmtCounter)(nil)
)

type stmtStartKey struct{}

type stmtStart struct {
	name string
	at   time.Time
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, stmtStartKey{}, stmtStart{name: stmtName(data.SQL), at: time.Now()})
}

func (c *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if s, ok := ctx.Value(stmtStartKey{}).(stmtStart); ok {
		c.add(s.name, time.Since(s.at))
	}
}

func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *stmtCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.add(stmtName(data.SQL), 0)
}

func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *stmtCounter) add(name string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats[name]
	if s == nil {
		s = &stmtStat{}
		c.stats[name] = s
	}
	s.n++
	s.d += d
}

func (c *stmtCounter) snapshot() map[string]stmtStat {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]stmtStat, len(c.stats))
	for k, v := range c.stats {
		out[k] = *v
	}
	return out
}

// stmtName is sql's sqlc query name ("-- name: OperationNextWake :one"), or
// else its first word, upper-cased.
func stmtName(sql string) string {
	s := strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(s, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		return name
	}
	if i := strings.IndexAny(s, " \t\n;"); i > 0 {
		s = s[:i]
	}
	return strings.ToUpper(s)
}

func mergeKeys[V any](a, b map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, "%s", name)
	return n
}
