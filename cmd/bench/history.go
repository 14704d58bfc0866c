package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/bench/internal/benchdb"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund"
)

// modeHistory measures refunds beside a long history that the retention job
// deletes as it goes: -history N finished refund operations in the table, whose
// retention ends at -expire-rate per second, and DeleteFinished, as the
// retention job calls it, every -retention-interval. It runs alone (not in
// -mode all).
//
// The refunds alternate, phase by phase (-phase), between that database and a
// second, empty one on the same server, so that the two are compared in
// neighbouring minutes of a machine whose speed drifts. Each database has its
// engine, opened once; between phases the refunds of one stop and the other's
// start. The history's retention runs only in its own phases, on a clock that
// moves only then: the empty database is what a refund costs with no history
// and no deletes, the history database what it costs with both.
//
// The history is copied in as HistoryOperationExpiringInsertSeries leaves it
// (operations only, as the engine leaves a refund that succeeded at its first
// attempt, no orders or refunds beside them), then vacuumed and analyzed. Their
// retention ends from a day after the fill, one every 1/-expire-rate seconds;
// the deletes call Engine.DeleteFinished with a clock that starts there and
// moves with the history phases, so that -expire-rate operations a second come
// due. The refunds made during the run are kept for historyRetention, beyond
// the run: what the deletes keep up with is the history's rate, not the
// refunds'.
//
// Every -sample it prints, of the phase's database, the refunds per second and
// the latency of the refunds that ended in the window, and of the history
// database: the operation table's and the step rows' size (with indexes and
// TOAST, the main fork, the indexes), their live and dead rows, autovacuum's
// runs, and the deletes: operations deleted, DeleteFinished's runs and their
// time, and the time of each batch (a DELETE of up to 1,000, timed by a tracer
// on the engine's control pool).
const modeHistory = "history"

const (
	// historyOrders is how many orders the refunds of each database share; each
	// can be refunded orderAmount / refundAmount times.
	historyOrders = 20_000
	// historyChunk is how many operations each statement of the fill inserts.
	historyChunk = 1_000_000
	// historyRetention is the retention of the refunds made during the run.
	historyRetention = 30 * 24 * time.Hour
	// historyExpiryDelay is how long after the fill the history's retention
	// starts to end, by the deletes' clock.
	historyExpiryDelay = 24 * time.Hour
)

// historyTablesStats are the tables whose size and dead rows the samples read.
var historyTablesStats = []string{"idemflow_operation", "idemflow_step_row"}

// historyOptions are -mode history's options.
type historyOptions struct {
	duration          time.Duration
	phase             time.Duration
	sample            time.Duration
	expireRate        float64
	retentionInterval time.Duration
}

func (h *historyOptions) register(fs *flag.FlagSet) {
	fs.DurationVar(&h.duration, "history-duration", 5*time.Minute, "history: how long the refunds run, both databases together")
	fs.DurationVar(&h.phase, "phase", 30*time.Second, "history: how long the refunds run on one database before they move to the other")
	fs.DurationVar(&h.sample, "sample", 5*time.Second, "history: how often the figures are read and printed")
	fs.Float64Var(&h.expireRate, "expire-rate", 0, "history: the history's operations whose retention ends per second of the history phases (0: 1,000,000 over the history phases, a busy day's deletes compressed into the run)")
	fs.DurationVar(&h.retentionInterval, "retention-interval", 10*time.Second, "history: how often the deletes run (the engine's Config.RetentionInterval, 1 minute by default)")
}

func (h *historyOptions) check() error {
	switch {
	case h.duration <= 0, h.phase <= 0, h.sample <= 0, h.retentionInterval <= 0:
		return errors.New("-history-duration, -phase, -sample and -retention-interval must be positive")
	case h.expireRate < 0:
		return errors.New("-expire-rate must not be negative")
	}
	if h.expireRate == 0 {
		h.expireRate = 1_000_000 / (h.duration.Seconds() / 2)
	}
	return nil
}

// historySample is one line of -mode history's output.
type historySample struct {
	Seconds float64 `json:"t_s"`
	// Database is the phase's: "history" or "empty".
	Database string  `json:"database"`
	OpsPerS  float64 `json:"ops_per_s"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	// The history database's tables.
	Tables []historyTable `json:"tables"`
	// The deletes in the window: operations deleted, DeleteFinished's runs
	// that ended and the longest of them, the batches and their times.
	Deleted    int64   `json:"deleted"`
	Runs       int     `json:"retention_runs"`
	RunMaxMs   float64 `json:"retention_run_max_ms"`
	Batches    int     `json:"batches"`
	BatchP50ms float64 `json:"batch_p50_ms"`
	BatchMaxms float64 `json:"batch_max_ms"`
	// Backlog is how many of the history's operations have come due by the
	// deletes' clock and are not deleted yet.
	Backlog      float64 `json:"backlog"`
	ErrorsWindow int64   `json:"errors"`
}

// historyTable is a table's size and rows in a sample.
type historyTable struct {
	Name             string  `json:"name"`
	TotalMB          float64 `json:"total_mb"`
	HeapMB           float64 `json:"heap_mb"`
	IndexMB          float64 `json:"index_mb"`
	LiveRows         int64   `json:"live_rows"`
	DeadRows         int64   `json:"dead_rows"`
	Autovacuums      int64   `json:"autovacuums"`
	SinceAutovacuumS float64 `json:"since_autovacuum_s"`
}

// historySummary is the run's figures by database.
type historySummary struct {
	Database string  `json:"database"`
	Summary  bool    `json:"summary"`
	Phases   int     `json:"phases"`
	Refunds  int64   `json:"refunds"`
	OpsPerS  float64 `json:"ops_per_s"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	// PhaseOpsPerS and PhaseP50ms are each phase's, in order.
	PhaseOpsPerS []float64 `json:"phase_ops_per_s"`
	PhaseP50ms   []float64 `json:"phase_p50_ms"`
	// Of the history database's deletes.
	Deleted    int64   `json:"deleted,omitempty"`
	Batches    int     `json:"batches,omitempty"`
	BatchP50ms float64 `json:"batch_p50_ms,omitempty"`
	BatchP99ms float64 `json:"batch_p99_ms,omitempty"`
	BatchMaxms float64 `json:"batch_max_ms,omitempty"`
	RunP50ms   float64 `json:"retention_run_p50_ms,omitempty"`
	RunMaxms   float64 `json:"retention_run_max_ms,omitempty"`
}

// deleteTimer is a pgx tracer that times the retention's batches: the
// store's OperationDeleteExpired statements.
type deleteTimer struct {
	mu      sync.Mutex
	batches []float32 // ms
	rows    int64
}

type deleteTimerKey struct{}

func (d *deleteTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(data.SQL, "-- name: OperationDeleteExpired ") {
		return context.WithValue(ctx, deleteTimerKey{}, time.Now())
	}
	return ctx
}

func (d *deleteTimer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	t0, ok := ctx.Value(deleteTimerKey{}).(time.Time)
	if !ok || data.Err != nil {
		return
	}
	ms := float32(time.Since(t0).Seconds() * 1000)
	d.mu.Lock()
	d.batches = append(d.batches, ms)
	d.rows += data.CommandTag.RowsAffected()
	d.mu.Unlock()
}

// take returns the batches timed since the last take, and the rows they
// deleted.
func (d *deleteTimer) take() ([]float32, int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, n := d.batches, d.rows
	d.batches, d.rows = nil, 0
	return b, n
}

// latencies collects the latency of the refunds that end in a window.
type latencies struct {
	mu     sync.Mutex
	ms     []float32
	errors int64
}

func (l *latencies) add(ms float32, err error) {
	l.mu.Lock()
	if err != nil {
		l.errors++
	} else {
		l.ms = append(l.ms, ms)
	}
	l.mu.Unlock()
}

func (l *latencies) take() ([]float32, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ms, e := l.ms, l.errors
	l.ms, l.errors = nil, 0
	return ms, e
}

// historyDB is one of the two databases of -mode history, with its engine.
type historyDB struct {
	name    string
	srv     *server
	env     *env
	control *pgxpool.Pool
	timer   *deleteTimer
	prefix  string
	next    atomic.Int64
}

func (b *bench) history(ctx context.Context, stdout io.Writer) (err error) {
	ho := b.opts.hist
	if b.opts.history < 1 {
		return errors.New("-mode history needs -history N, the finished operations to fill the database with")
	}
	hist := &historyDB{name: "history", srv: b.srv, timer: &deleteTimer{}, prefix: "run-"}
	expiresFrom := time.Now().Add(historyExpiryDelay).Truncate(time.Second)
	if err := b.fillExpiring(ctx, expiresFrom, ho.expireRate); err != nil {
		return err
	}
	emptySrv, err := openServer(ctx, b.opts, b.quiet)
	if err != nil {
		return err
	}
	defer emptySrv.stop(context.WithoutCancel(ctx))
	empty := &historyDB{name: "empty", srv: emptySrv, timer: &deleteTimer{}, prefix: "run-"}

	for _, db := range []*historyDB{hist, empty} {
		if err := db.srv.createOrders(ctx, benchClient, db.prefix, historyOrders, orderAmount); err != nil {
			return err
		}
		if db.control, err = db.srv.pool(ctx, 4, db.timer); err != nil {
			return err
		}
		defer db.control.Close()
		cfg := envConfig{conns: b.opts.c, withEngine: true, workers: true, engine: func(c *engine.Config) {
			c.Retention = historyRetention
			c.ControlPool = db.control
		}}
		// The env's srv is b.srv; the empty database's env needs its own.
		eb := *b
		eb.srv = db.srv
		if db.env, err = eb.newEnvWith(ctx, cfg); err != nil {
			return err
		}
		defer db.env.close(ctx)
		b.logf("history: %s: warming up with %d refunds", db.name, b.opts.warmup)
		var lat latencies
		if err := db.drive(ctx, time.Time{}, b.opts.warmup, b.opts.c, &lat); err != nil {
			return fmt.Errorf("%s: warm-up: %w", db.name, err)
		}
	}
	stats, err := b.srv.pool(ctx, 1, nil)
	if err != nil {
		return err
	}
	defer stats.Close()
	return b.historyRun(ctx, stdout, hist, empty, stats, expiresFrom)
}

// fillExpiring fills the benchmark's database with -history finished
// operations whose retention ends from expiresFrom, rate per second.
func (b *bench) fillExpiring(ctx context.Context, expiresFrom time.Time, rate float64) error {
	n := b.opts.history
	pool, err := b.srv.pool(ctx, 1, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := benchdb.New()
	start := time.Now()
	for first := 1; first <= n; first += historyChunk {
		last := min(n, first+historyChunk-1)
		got, err := q.HistoryOperationExpiringInsertSeries(ctx, pool, benchdb.HistoryOperationExpiringInsertSeriesParams{
			Scope: benchClient, Prefix: historyPrefix, Amount: refundAmount,
			ExpiresFrom: expiresFrom, Rate: rate, First: int32(first), Last: int32(last),
		})
		if err != nil {
			return fmt.Errorf("history: insert operations %d to %d: %w", first, last, err)
		}
		if got != int64(last-first+1) {
			return fmt.Errorf("history: inserted %d operations of %d", got, last-first+1)
		}
		b.logf("history: %d of %d operations inserted (%s)", last, n, time.Since(start).Round(time.Second))
	}
	// As fillHistory: not through sqlc, VACUUM cannot run in a function.
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) idemflow_operation"); err != nil {
		return fmt.Errorf("history: vacuum and analyze: %w", err)
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		b.logf("history: no CHECKPOINT after the fill (%v)", err)
	}
	b.logf("history: %d operations inserted and vacuumed in %s", n, time.Since(start).Round(time.Second))
	return nil
}

// drive runs refunds on db with c at once until until (or, when until is zero,
// count of them), and records their latency in lat.
func (db *historyDB) drive(ctx context.Context, until time.Time, count, c int, lat *latencies) error {
	var (
		wg    sync.WaitGroup
		first atomic.Pointer[error]
		done  atomic.Int64
	)
	for range c {
		wg.Go(func() {
			for ctx.Err() == nil {
				if until.IsZero() && done.Add(1) > int64(count) || !until.IsZero() && !time.Now().Before(until) {
					return
				}
				i := db.next.Add(1) - 1
				t0 := time.Now()
				err := db.refund(ctx, int(i))
				lat.add(float32(time.Since(t0).Seconds()*1000), err)
				if err != nil {
					first.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	if p := first.Load(); p != nil && until.IsZero() {
		return *p
	}
	return nil
}

// refund runs refund i of db: key run-<i+1>, of one of the shared orders.
func (db *historyDB) refund(ctx context.Context, i int) error {
	// engineRefund's key is the order's id too; here the key is the
	// refund's, the order one of historyOrders.
	k := key(db.prefix, i)
	order := key(db.prefix, i%historyOrders)
	started, err := engine.Start(ctx, db.env.eng, db.env.wf.Refund, benchClient, k,
		refund.RefundInput{Client: benchClient, OrderID: order, Amount: refundAmount}, nil)
	if err != nil {
		return err
	}
	info, err := started.Wait(ctx)
	if err != nil {
		return fmt.Errorf("wait for %s: %w", k, err)
	}
	if info.Status != engine.StatusSucceeded {
		return fmt.Errorf("refund %s ended %s: %v", k, info.Status, info.Error)
	}
	return nil
}

// historyRun alternates the refunds between the two databases, runs the
// history's deletes in its phases, and prints the samples and the summary.
func (b *bench) historyRun(ctx context.Context, stdout io.Writer, hist, empty *historyDB, stats *pgxpool.Pool, expiresFrom time.Time) error {
	ho := b.opts.hist
	var (
		lat        latencies
		runsMu     sync.Mutex
		runs       []float32 // DeleteFinished's runs that ended, ms
		histActive atomic.Bool
		// clock is how long the history phases have run so far, the deletes'
		// clock past expiresFrom, in nanoseconds; phaseStart is when the
		// current history phase started.
		clockBase  atomic.Int64
		phaseStart atomic.Int64
		runErr     atomic.Pointer[error]
	)
	clock := func() time.Duration {
		d := time.Duration(clockBase.Load())
		if histActive.Load() {
			d += time.Since(time.Unix(0, phaseStart.Load()))
		}
		return d
	}
	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer stopRun()

	// The deletes: what the retention job does, on the history phases' clock,
	// during the history phases only (a run still going at a phase's end is
	// cancelled, as a job is at shutdown).
	deletes := func(ctx context.Context) {
		tick := time.NewTicker(ho.retentionInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			now := expiresFrom.Add(clock())
			t0 := time.Now()
			_, err := hist.env.eng.DeleteFinished(ctx, &now)
			d := time.Since(t0)
			if err != nil && ctx.Err() == nil {
				runErr.CompareAndSwap(nil, &err)
			}
			if ctx.Err() != nil {
				return
			}
			runsMu.Lock()
			runs = append(runs, float32(d.Seconds()*1000))
			runsMu.Unlock()
		}
	}

	if !b.opts.json {
		fmt.Fprintf(stdout, historyLine, "t s", "database", "ops/s", "p50 ms", "p99 ms", "op MB", "heap MB", "index MB", "live", "dead", "autovac",
			"step MB", "deleted", "runs", "run max ms", "batches", "batch p50", "batch max", "backlog", "errors")
	}
	sums := map[string]*historySummary{hist.name: {Database: hist.name, Summary: true}, empty.name: {Database: empty.name, Summary: true}}
	all := map[string][]float32{}
	var allBatches, allRuns []float32
	start := time.Now()
	end := start.Add(ho.duration)
	q := benchdb.New()
	phases := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		db := hist
		if phases%2 == 1 {
			db = empty
		}
		phases++
		phaseEnd := time.Now().Add(ho.phase)
		if phaseEnd.After(end) {
			phaseEnd = end
		}
		stopDeletes := func() {}
		if db == hist {
			phaseStart.Store(time.Now().UnixNano())
			histActive.Store(true)
			delCtx, cancel := context.WithCancel(runCtx)
			bg.Go(func() { deletes(delCtx) })
			stopDeletes = func() { cancel(); bg.Wait() }
		}
		driveErr := make(chan error, 1)
		p0 := time.Now()
		go func() { driveErr <- db.drive(runCtx, phaseEnd, 0, b.opts.c, &lat) }()
		var phaseN int64
		var phaseLat []float32
		for sampled := false; !sampled; {
			next := time.Now().Add(ho.sample)
			if !next.Before(phaseEnd) {
				next, sampled = phaseEnd, true
			}
			w0 := time.Now()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(next)):
			}
			if sampled {
				stopDeletes()
				if err := <-driveErr; err != nil {
					return err
				}
			}
			ms, errs := lat.take()
			batches, deleted := hist.timer.take()
			runsMu.Lock()
			wRuns := runs
			runs = nil
			runsMu.Unlock()
			tables, err := q.HistoryTableStats(ctx, stats, historyTablesStats)
			if err != nil {
				return fmt.Errorf("history: read the tables' statistics: %w", err)
			}
			s := historySample{
				Seconds: round(time.Since(start).Seconds(), 1), Database: db.name,
				OpsPerS: round(float64(len(ms))/time.Since(w0).Seconds(), 1),
				Deleted: deleted, Runs: len(wRuns), Batches: len(batches), ErrorsWindow: errs,
			}
			phaseN += int64(len(ms))
			phaseLat = append(phaseLat, ms...)
			all[db.name] = append(all[db.name], ms...)
			allBatches = append(allBatches, batches...)
			allRuns = append(allRuns, wRuns...)
			sums[hist.name].Deleted += deleted
			slices.Sort(ms)
			if len(ms) > 0 {
				s.P50ms, s.P99ms = percentile(ms, 0.5), percentile(ms, 0.99)
			}
			if len(wRuns) > 0 {
				s.RunMaxMs = round(float64(slices.Max(wRuns)), 1)
			}
			if len(batches) > 0 {
				slices.Sort(batches)
				s.BatchP50ms, s.BatchMaxms = percentile(batches, 0.5), round(float64(batches[len(batches)-1]), 1)
			}
			// What has come due by the deletes' clock and is not deleted yet.
			due := int64(clock().Seconds() * ho.expireRate)
			s.Backlog = float64(min(due, int64(b.opts.history)) - sums[hist.name].Deleted)
			for _, t := range tables {
				s.Tables = append(s.Tables, historyTable{
					Name: t.Name, TotalMB: mb(t.TotalBytes), HeapMB: mb(t.HeapBytes), IndexMB: mb(t.IndexBytes),
					LiveRows: t.LiveRows, DeadRows: t.DeadRows, Autovacuums: t.Autovacuums,
					SinceAutovacuumS: round(t.SinceAutovacuumS, 0),
				})
			}
			b.printSample(stdout, s)
		}
		if db == hist {
			histActive.Store(false)
			clockBase.Add(int64(time.Since(time.Unix(0, phaseStart.Load()))))
		}
		sum := sums[db.name]
		sum.Phases++
		sum.PhaseOpsPerS = append(sum.PhaseOpsPerS, round(float64(phaseN)/time.Since(p0).Seconds(), 1))
		slices.Sort(phaseLat)
		if len(phaseLat) > 0 {
			sum.PhaseP50ms = append(sum.PhaseP50ms, percentile(phaseLat, 0.5))
		}
		if p := runErr.Load(); p != nil {
			return fmt.Errorf("history: the deletes: %w", *p)
		}
	}
	stopRun()
	bg.Wait()

	for _, db := range []*historyDB{hist, empty} {
		sum := sums[db.name]
		ms := all[db.name]
		slices.Sort(ms)
		sum.Refunds = int64(len(ms))
		if len(ms) > 0 {
			sum.P50ms, sum.P99ms = percentile(ms, 0.5), percentile(ms, 0.99)
		}
		sum.OpsPerS = round(medianOf(slices.Clone(sum.PhaseOpsPerS)), 1)
		if db == hist {
			slices.Sort(allBatches)
			sum.Batches = len(allBatches)
			if len(allBatches) > 0 {
				sum.BatchP50ms, sum.BatchP99ms = percentile(allBatches, 0.5), percentile(allBatches, 0.99)
				sum.BatchMaxms = round(float64(allBatches[len(allBatches)-1]), 1)
			}
			slices.Sort(allRuns)
			if len(allRuns) > 0 {
				sum.RunP50ms, sum.RunMaxms = percentile(allRuns, 0.5), round(float64(allRuns[len(allRuns)-1]), 1)
			}
		}
		if b.opts.json {
			line, err := json.Marshal(sum)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s\n", line)
			continue
		}
		fmt.Fprintf(stdout, "\n%s: %d phases, %d refunds, %.0f refunds/s (median of the phases: %v), p50 %.2f ms (phases: %v), p99 %.2f ms",
			db.name, sum.Phases, sum.Refunds, sum.OpsPerS, sum.PhaseOpsPerS, sum.P50ms, sum.PhaseP50ms, sum.P99ms)
		if db == hist {
			fmt.Fprintf(stdout, "; deleted %d in %d batches (p50 %.1f ms, p99 %.1f ms, max %.1f ms), retention runs p50 %.0f ms, max %.0f ms",
				sum.Deleted, sum.Batches, sum.BatchP50ms, sum.BatchP99ms, sum.BatchMaxms, sum.RunP50ms, sum.RunMaxms)
		}
		fmt.Fprintln(stdout)
	}
	if !b.opts.json {
		h, e := sums[hist.name], sums[empty.name]
		fmt.Fprintf(stdout, "\nhistory / empty: throughput %.3f, p50 %.3f\n", h.OpsPerS/e.OpsPerS, h.P50ms/e.P50ms)
	}
	return nil
}

// historyLine is the format of a line of -mode history's table.
const historyLine = "%5v %8v %6v %7v %7v %7v %7v %8v %9v %9v %7v %7v %8v %4v %10v %7v %9v %9v %8v %6v\n"

func (b *bench) printSample(stdout io.Writer, s historySample) {
	if b.opts.json {
		line, err := json.Marshal(s)
		if err != nil {
			panic(err) // numbers and strings always encode
		}
		fmt.Fprintf(stdout, "%s\n", line)
		return
	}
	var op, step historyTable
	for _, t := range s.Tables {
		switch t.Name {
		case "idemflow_operation":
			op = t
		case "idemflow_step_row":
			step = t
		}
	}
	f := func(format string, v any) string { return fmt.Sprintf(format, v) }
	fmt.Fprintf(stdout, historyLine, f("%.0f", s.Seconds), s.Database, f("%.0f", s.OpsPerS), f("%.2f", s.P50ms), f("%.2f", s.P99ms),
		f("%.0f", op.TotalMB), f("%.0f", op.HeapMB), f("%.0f", op.IndexMB), op.LiveRows, op.DeadRows, op.Autovacuums,
		f("%.1f", step.TotalMB), s.Deleted, s.Runs, f("%.0f", s.RunMaxMs), s.Batches, f("%.1f", s.BatchP50ms), f("%.1f", s.BatchMaxms),
		f("%.0f", s.Backlog), s.ErrorsWindow)
}

func mb(bytes int64) float64 { return round(float64(bytes)/(1<<20), 1) }
