// Command bench measures what a refund costs through idemflow, and what the same
// database writes cost without it.
//
// Usage:
//
//	go run ./cmd/bench [-n 2000] [-c 32] [-mode all] [-json] [-history 0] [-rounds 1]
//
// It runs refunds of the demo's refund workflow (workflows/refund) with the demo's
// fake payment provider (cmd/internal/fakeprovider) in this process, in four modes:
//
//   - engine: engine.Start and Started.Wait, no HTTP;
//   - http: POST /refunds through the idempotency package's handler, served on
//     loopback TCP by an http.Server in this process and called by an http.Client
//     in this process;
//   - replay: engine.Start of keys whose refund has finished, as a retry does
//     (the reservation finds the key taken, then one read);
//   - baseline: a hand-written refund with no engine: one batched transaction
//     (the key's reservation, the order's lock, the pending refund, the ledger
//     move), the provider call, one batched transaction (the refund marked
//     succeeded, the answer stored).
//
// -mode pooled is engine through a PgBouncer in transaction mode that the
// benchmark starts in front of its server (Debian's pgbouncer; 20 server
// connections for the application's and the provider's pools together), with
// the pools made by engine.BoundPool with PoolOpts.Pooler and the engine with
// Config.Pooler. -mode engine,pooled runs the two in turn in every round.
//
// -mode fairness, which runs on its own, measures the engine's per-scope bound
// (Config.MaxInFlightPerScope) instead: four light clients and one heavy client
// at 20 times their rate on a process whose MaxInFlight they exceed, the light
// ones' latency and throughput alone, with the heavy one and no per-scope bound,
// and with it (-duration, -max-in-flight, -max-in-flight-per-scope, -rate,
// -retry-delay, -provider-latency; see modeFairness).
//
// The provider is called through its http.Handler in memory (an http.RoundTripper
// that serves the request without a socket), the same way in every mode; it
// keeps its refunds in the same database, through a pool of its own.
//
// For each mode it prints the throughput, the latency percentiles (from the start
// of an operation to its stored result), and the database work per operation:
// commits, rollbacks and WAL syncs from the server's statistics, and statements,
// transactions and round trips counted by a pgx tracer on each pool (the
// engine's statements apart from the steps', the provider's apart from both).
// -json prints one JSON object per mode per line instead. Each mode also reports
// the CPU time of this process and of the cluster, and this process's heap
// allocations, per operation. -cpuprofile, -memprofile and -trace write a CPU
// profile, an allocation profile and an execution trace of each mode's timed
// operations.
//
// The database is DATABASE_URL's server or, when it is unset, a private cluster
// in -data-dir, started with PostgreSQL's defaults (fsync and synchronous_commit
// on) and stopped at exit if this run started it. Each run creates a database of
// its own, idemflow_bench_<random>, and drops it at exit.
//
// -history N first fills that database with N finished refunds, as the engine
// leaves them (operation rows with their checkpoints, orders and refunds), and vacuums and
// analyzes them, to show what a history in the tables costs each mode.
//
// -mode history, which runs on its own, measures refunds beside a history of
// -history N finished operations that the retention deletes as it goes, against
// an empty database in alternating phases, and samples the tables' size, dead
// rows, autovacuum's runs and the deletes' time as it goes (-history-duration,
// -phase, -sample, -expire-rate, -retention-interval; see modeHistory).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The modes, in the order -mode all runs them.
var allModes = []string{modeBaseline, modeEngine, modeMetrics, modeHTTP, modeReplay}

const (
	modeEngine = "engine"
	// modeMetrics is modeEngine with the Prometheus adapter observing the
	// engine (contrib/idemflowprom), on a registry of its own.
	modeMetrics  = "metrics"
	modeHTTP     = "http"
	modeReplay   = "replay"
	modeBaseline = "baseline"
)

// options are the command line's.
type options struct {
	n, c   int
	warmup int
	// history is how many finished refund operations fill the database before
	// the timed modes.
	history     int
	modes       []string
	json        bool
	dataDir     string
	databaseURL string
	// cpuProfile, when set, is the prefix of a CPU profile per mode of its timed
	// operations: <cpuProfile>.<mode>.pprof.
	cpuProfile string
	// trace, when set, is the prefix of an execution trace per mode of its
	// timed operations: <trace>.<mode>.trace, for go tool trace.
	trace string
	// memProfile, when set, is the prefix of a profile per mode of the heap
	// allocations of the timed operations: <memProfile>.<mode>.allocs.pprof.
	memProfile string
	// waitQuiet, when positive, bounds how long each mode waits, before its timed
	// operations, for the machine to be idle.
	waitQuiet time.Duration
	// rounds is how many times the modes run, in turn.
	rounds int
	// fair holds -mode fairness's options.
	fair fairOptions
	// hist holds -mode history's options.
	hist historyOptions
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	opts, err := parseOptions(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := benchmark(ctx, opts, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{databaseURL: getenv("DATABASE_URL")}
	fs.IntVar(&o.n, "n", 2000, "operations per mode")
	fs.IntVar(&o.c, "c", 32, "concurrency: operations in flight at once")
	mode := fs.String("mode", "all", "engine, metrics, http, replay, baseline or all (a comma-separated list works too), or fairness or history on its own")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per mode per line")
	fs.IntVar(&o.rounds, "rounds", 1, "run the modes this many times, in turn (the order reversed every other round), and print the median of each mode with the per-round ratios to baseline: on a machine whose speed drifts, modes next to each other in time compare best")
	fs.IntVar(&o.history, "history", 0, "before the modes, fill the database with this many finished refund operations (with their steps, orders and refunds), then VACUUM ANALYZE")
	fs.IntVar(&o.warmup, "warmup", -1, "untimed operations per mode before the timed ones (default: 4 per unit of concurrency, at least 50)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of each mode's timed operations to `prefix`.<mode>.pprof")
	fs.StringVar(&o.trace, "trace", "", "write an execution trace of each mode's timed operations to `prefix`.<mode>.trace (go tool trace reads it)")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a profile of the heap allocations of each mode's timed operations to `prefix`.<mode>.allocs.pprof (every allocation of the timed operations is sampled, which slows them; the profile adds up the modes timed so far: run one -mode for its own)")
	fs.DurationVar(&o.waitQuiet, "wait-quiet", 0, "before each mode's timed operations, wait up to this long until other programs use under 20% of the CPUs for 2 seconds (for a shared machine; 0: do not wait)")
	fs.StringVar(&o.dataDir, "data-dir", filepath.Join(os.TempDir(), "idemflow-bench-pg"),
		"data directory of the private PostgreSQL cluster used when DATABASE_URL is unset")
	o.fair.register(fs)
	o.hist.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case o.n < 1:
		return nil, errors.New("-n must be at least 1")
	case o.c < 1:
		return nil, errors.New("-c must be at least 1")
	case o.rounds < 1:
		return nil, errors.New("-rounds must be at least 1")
	case o.c > 256:
		return nil, errors.New("-c must be at most 256 (each operation in flight holds a connection)")
	case o.history < 0 || o.history > math.MaxInt32:
		return nil, fmt.Errorf("-history must be between 0 and %d", math.MaxInt32)
	}
	if o.warmup < 0 {
		o.warmup = max(50, 4*o.c)
	}
	for _, m := range strings.Split(*mode, ",") {
		m = strings.TrimSpace(m)
		switch {
		case m == "all":
			o.modes = slices.Clone(allModes)
		case slices.Contains(allModes, m), m == modeFairness, m == modeHistory, m == modePooled:
			if !slices.Contains(o.modes, m) {
				o.modes = append(o.modes, m)
			}
		default:
			return nil, fmt.Errorf("-mode: %q is not one of engine, metrics, http, replay, baseline, all, pooled, fairness, history", m)
		}
	}
	if slices.Contains(o.modes, modeFairness) {
		if len(o.modes) > 1 {
			return nil, errors.New("-mode fairness runs on its own")
		}
		if err := o.fair.check(); err != nil {
			return nil, err
		}
	}
	if slices.Contains(o.modes, modeHistory) {
		if len(o.modes) > 1 {
			return nil, errors.New("-mode history runs on its own")
		}
		if err := o.hist.check(); err != nil {
			return nil, err
		}
	}
	return o, nil
}
