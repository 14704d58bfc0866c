package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one mode's figures. Per-operation figures divide what the timed
// operations cost by n.
type result struct {
	Mode string `json:"mode"`
	// Round counts the runs of the modes (-rounds), from 1.
	Round       int `json:"round"`
	N           int `json:"n"`
	Concurrency int `json:"concurrency"`
	// History is how many finished refund operations were in the tables
	// before the modes ran (-history).
	History int     `json:"history"`
	Errors  int64   `json:"errors"`
	Seconds float64 `json:"seconds"`
	OpsPerS float64 `json:"ops_per_s"`
	// Latency of one operation, from its start to its stored result.
	P50ms float64 `json:"p50_ms"`
	P90ms float64 `json:"p90_ms"`
	P99ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`

	// From the server's statistics: every transaction in the benchmark's
	// database (read-only ones too; the engine's, the steps', River's, the
	// provider's), and the cluster's WAL.
	CommitsPerOp    float64 `json:"commits_per_op"`
	RollbacksPerOp  float64 `json:"rollbacks_per_op"`
	WALSyncsPerOp   float64 `json:"wal_syncs_per_op"`
	WALWritesPerOp  float64 `json:"wal_writes_per_op"`
	WALRecordsPerOp float64 `json:"wal_records_per_op"`
	WALBytesPerOp   float64 `json:"wal_bytes_per_op"`
	// Buffer lookups of the database's statements: a count of the pages they
	// touched, which a slower machine does not change, unlike time. Read means
	// not in shared buffers (maybe in the OS's cache).
	BlocksHitPerOp  float64 `json:"blocks_hit_per_op"`
	BlocksReadPerOp float64 `json:"blocks_read_per_op"`

	// From the tracer on the application's pool: the engine with its steps and
	// River (or the baseline). A transaction is a COMMIT, or a statement or batch
	// sent outside a transaction block.
	EngineCommitsPerOp    float64 `json:"engine_commits_per_op"`
	EngineRollbacksPerOp  float64 `json:"engine_rollbacks_per_op"`
	StatementsPerOp       float64 `json:"statements_per_op"`
	EngineStatementsPerOp float64 `json:"engine_statements_per_op"`
	StepStatementsPerOp   float64 `json:"step_statements_per_op"`
	RiverStatementsPerOp  float64 `json:"river_statements_per_op"`
	OtherStatementsPerOp  float64 `json:"other_statements_per_op"`
	TxControlPerOp        float64 `json:"begin_commit_per_op"`
	RoundTripsPerOp       float64 `json:"round_trips_per_op"`
	// CommitGroupsPerOp are the engine's group commits (engine.Config's
	// GroupCommit) per operation; CommitGroupSize the mean transactions in
	// one, CommitGroupsSplit those whose member failed so that each went
	// again alone.
	CommitGroupsPerOp float64 `json:"commit_groups_per_op"`
	CommitGroupSize   float64 `json:"commit_group_size"`
	CommitGroupsSplit int64   `json:"commit_groups_split"`
	// By name: sqlc's query name, BEGIN, COMMIT, or a statement's first word.
	Statements map[string]float64 `json:"statements"`

	// From the tracer on the provider's pool.
	ProviderCommitsPerOp    float64            `json:"provider_commits_per_op"`
	ProviderStatementsPerOp float64            `json:"provider_statements_per_op"`
	ProviderRoundTripsPerOp float64            `json:"provider_round_trips_per_op"`
	ProviderStatements      map[string]float64 `json:"provider_statements"`

	// CPU time per operation of this process (the engine, the steps, the
	// provider's handler, the HTTP client and server) and of the PostgreSQL
	// cluster (-1 when it is not the private one); the share of the machine's
	// CPU that was busy, and that other programs used (noise; -1 when not known).
	BenchCPUusPerOp    float64 `json:"bench_cpu_us_per_op"`
	PostgresCPUusPerOp float64 `json:"postgres_cpu_us_per_op"`
	MachineBusyPct     float64 `json:"machine_busy_pct"`
	OthersCPUPct       float64 `json:"others_cpu_pct"`

	// Heap allocations of this process per operation, as BenchCPUusPerOp
	// counts its CPU time: the engine's, the steps', the provider's, the HTTP
	// client's and server's.
	AllocsPerOp     float64 `json:"allocs_per_op"`
	AllocBytesPerOp float64 `json:"alloc_bytes_per_op"`

	// PeakRSSMB is the process's peak resident set so far (getrusage's maxrss).
	PeakRSSMB float64 `json:"peak_rss_mb"`
}

func newResult(mode string, opts *options, lat []float32, failed int64, elapsed time.Duration, cpu cpuUse, allocs allocCount, db serverStats, app, prov counts) *result {
	n := float64(opts.n)
	per := func(v int64) float64 { return round(float64(v)/n, 3) }
	perName := func(m map[string]int64) map[string]float64 {
		out := make(map[string]float64, len(m))
		for k, v := range m {
			out[k] = per(v)
		}
		return out
	}
	slices.Sort(lat)
	groupSize := 0.0
	if app.groups > 0 {
		groupSize = round(float64(app.grouped)/float64(app.groups), 2)
	}
	r := &result{
		CommitGroupSize: groupSize,
		Mode:            mode,
		N:               opts.n,
		Concurrency:     opts.c,
		History:         opts.history,
		Errors:          failed,
		Seconds:         round(elapsed.Seconds(), 3),
		OpsPerS:         round(n/elapsed.Seconds(), 1),
		P50ms:           percentile(lat, 0.50),
		P90ms:           percentile(lat, 0.90),
		P99ms:           percentile(lat, 0.99),
		MaxMs:           round(float64(lat[len(lat)-1]), 3),

		CommitsPerOp:    per(db.commits),
		RollbacksPerOp:  per(db.rollbacks),
		WALSyncsPerOp:   per(db.walSyncs),
		WALWritesPerOp:  per(db.walWrites),
		WALRecordsPerOp: per(db.walRecords),
		WALBytesPerOp:   round(float64(db.walBytes)/n, 0),
		BlocksHitPerOp:  per(db.blocksHit),
		BlocksReadPerOp: per(db.blocksRead),

		EngineCommitsPerOp:    per(app.commits),
		EngineRollbacksPerOp:  per(app.rollbacks),
		StatementsPerOp:       per(app.statements()),
		EngineStatementsPerOp: per(app.stmts[catEngine]),
		StepStatementsPerOp:   per(app.stmts[catSteps]),
		RiverStatementsPerOp:  per(app.stmts[catRiver]),
		OtherStatementsPerOp:  per(app.stmts[catOther] + app.stmts[catProvider]),
		TxControlPerOp:        per(app.stmts[catTxControl]),
		RoundTripsPerOp:       per(app.roundTrips),
		Statements:            perName(app.byName),
		CommitGroupsPerOp:     per(app.groups),
		CommitGroupsSplit:     app.splits,

		ProviderCommitsPerOp:    per(prov.commits),
		ProviderStatementsPerOp: per(prov.statements()),
		ProviderRoundTripsPerOp: per(prov.roundTrips),
		ProviderStatements:      perName(prov.byName),

		BenchCPUusPerOp:    round(float64(cpu.benchPerOp)/1e3, 1),
		PostgresCPUusPerOp: -1,
		MachineBusyPct:     round(100*cpu.machineBusy, 1),
		OthersCPUPct:       round(100*cpu.others, 1),

		AllocsPerOp:     per(int64(allocs.objects)),
		AllocBytesPerOp: round(float64(allocs.bytes)/n, 0),

		PeakRSSMB: round(peakRSSMB(), 1),
	}
	if cpu.serverPerOp >= 0 {
		r.PostgresCPUusPerOp = round(float64(cpu.serverPerOp)/1e3, 1)
	}
	if cpu.machineBusy < 0 {
		r.MachineBusyPct = -1
	}
	if cpu.others < 0 {
		r.OthersCPUPct = -1
	}
	return r
}

// percentile returns the p-quantile of sorted by the nearest-rank method.
func percentile(sorted []float32, p float64) float64 {
	k := int(math.Ceil(p*float64(len(sorted)))) - 1
	return round(float64(sorted[max(k, 0)]), 3)
}

func round(v float64, digits int) float64 {
	f := math.Pow(10, float64(digits))
	return math.Round(v*f) / f
}

// report prints the results: a table, or JSON lines.
type report struct {
	w       io.Writer
	opts    *options
	results []*result
}

func newReport(w io.Writer, opts *options, srv *server) *report {
	r := &report{w: w, opts: opts}
	if !opts.json {
		s := srv.settings
		fmt.Fprintf(w, "PostgreSQL %s (fsync=%s, synchronous_commit=%s, full_page_writes=%s, wal_sync_method=%s, shared_buffers=%s), database %s\n",
			s.ServerVersion, s.Fsync, s.SynchronousCommit, s.FullPageWrites, s.WalSyncMethod, s.SharedBuffers, srv.dbName)
		fmt.Fprintf(w, "%s/%s, %d CPUs, GOMAXPROCS %d; n=%d per mode, concurrency %d, %d warm-up operations per mode, %d finished operations of history\n\n",
			runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), opts.n, opts.c, opts.warmup, opts.history)
	}
	return r
}

func (r *report) add(res *result) {
	r.results = append(r.results, res)
	if r.opts.json {
		line, err := json.Marshal(res)
		if err != nil {
			panic(err) // a struct of numbers, strings and maps always encodes
		}
		fmt.Fprintf(r.w, "%s\n", line)
	}
}

// finish prints the table and, per mode, the statements by name.
func (r *report) finish() {
	if r.opts.json {
		return
	}
	tw := tabwriter.NewWriter(r.w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tmode\tops/s\tp50 ms\tp90 ms\tp99 ms\tcommits/op\trollbacks/op\tWAL syncs/op\tbuffers/op\tapp commits/op\tprovider commits/op\tapp stmts/op\tengine\tsteps\triver\tBEGIN+COMMIT/op\tround trips/op\tgroups/op\tgroup size\tprovider stmts/op\tbench CPU us/op\tallocs/op\tPG CPU us/op\tothers' CPU %\tpeak RSS MB\terrors\t")
	for _, res := range r.results {
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.1f\t%.0f\t%d\t\n",
			res.Round, res.Mode, res.OpsPerS, res.P50ms, res.P90ms, res.P99ms,
			res.CommitsPerOp, res.RollbacksPerOp, res.WALSyncsPerOp, res.BlocksHitPerOp+res.BlocksReadPerOp,
			res.EngineCommitsPerOp, res.ProviderCommitsPerOp,
			res.StatementsPerOp, res.EngineStatementsPerOp, res.StepStatementsPerOp, res.RiverStatementsPerOp,
			res.TxControlPerOp, res.RoundTripsPerOp, res.CommitGroupsPerOp, res.CommitGroupSize, res.ProviderStatementsPerOp,
			res.BenchCPUusPerOp, res.AllocsPerOp, res.PostgresCPUusPerOp, res.OthersCPUPct, res.PeakRSSMB, res.Errors)
	}
	_ = tw.Flush()
	fmt.Fprintln(r.w)
	for _, res := range r.results {
		if res.Round > 1 {
			continue // the same statements as in round 1
		}
		fmt.Fprintf(r.w, "%s, statements per operation:\n  app pool:      %s\n  provider pool: %s\n",
			res.Mode, byName(res.Statements), byName(res.ProviderStatements))
	}
	if r.opts.rounds > 1 {
		fmt.Fprintln(r.w)
		r.summary()
	}
}

// summary prints, per mode, the medians over the rounds and, for every mode but
// the baseline, its ratio to the baseline of the same round: baseline's
// throughput over the mode's, and the mode's p50 over baseline's.
func (r *report) summary() {
	byMode := map[string][]*result{}
	for _, res := range r.results {
		byMode[res.Mode] = append(byMode[res.Mode], res)
	}
	fmt.Fprintf(r.w, "medians over %d rounds:\n", r.opts.rounds)
	for _, mode := range r.opts.modes {
		rs := byMode[mode]
		line := fmt.Sprintf("  %-8s %7.0f ops/s  p50 %6.2f ms  p99 %6.2f ms",
			mode, median(rs, func(x *result) float64 { return x.OpsPerS }),
			median(rs, func(x *result) float64 { return x.P50ms }),
			median(rs, func(x *result) float64 { return x.P99ms }))
		base := byMode[modeBaseline]
		if mode != modeBaseline && len(base) == len(rs) {
			var slower, later []string
			var slowerV, laterV []float64
			for i := range rs {
				s, l := base[i].OpsPerS/rs[i].OpsPerS, rs[i].P50ms/base[i].P50ms
				slowerV, laterV = append(slowerV, s), append(laterV, l)
				slower, later = append(slower, fmt.Sprintf("%.2f", s)), append(later, fmt.Sprintf("%.2f", l))
			}
			line += fmt.Sprintf("  baseline/this throughput %s (median %.2f), p50 this/baseline %s (median %.2f)",
				strings.Join(slower, " "), medianOf(slowerV), strings.Join(later, " "), medianOf(laterV))
		}
		fmt.Fprintln(r.w, line)
	}
}

func median(rs []*result, f func(*result) float64) float64 {
	v := make([]float64, len(rs))
	for i, x := range rs {
		v[i] = f(x)
	}
	return medianOf(v)
}

// medianOf returns the median of v, the mean of the middle two for an even
// count; v is sorted in place.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// byName lists per-operation counts by name, largest first, leaving out what
// happened less than once per thousand operations.
func byName(m map[string]float64) string {
	names := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b))
	})
	var parts []string
	rare := 0.0
	for _, name := range names {
		if m[name] < 0.001 {
			rare += m[name]
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.3g", name, m[name]))
	}
	if rare > 0 {
		parts = append(parts, fmt.Sprintf("(others %.3g)", rare))
	}
	return strings.Join(parts, ", ")
}
