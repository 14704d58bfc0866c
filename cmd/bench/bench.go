package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemflow/idemflow/cmd/bench/internal/benchdb"
	"github.com/idemflow/idemflow/contrib/idemflowprom"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

const (
	// benchClient is the client (the scope) of every order and refund.
	benchClient = "bench"
	// orderAmount is what each order is of; refundAmount, what each refund takes.
	orderAmount  = 10_000
	refundAmount = 100
	// historyPrefix starts the keys and order ids of -history's operations;
	// no mode's prefix (mode + "-") starts with it.
	historyPrefix = "history-"
	// opTimeout bounds one operation.
	opTimeout = time.Minute
)

// bench runs the modes on one server.
type bench struct {
	opts *options
	srv  *server
	// quiet is the logger of the engine, the provider and the API: warnings and
	// errors only, and a With formats nothing until a line is written
	// (lazyHandler), so that logging costs next to nothing per operation.
	quiet *slog.Logger
	// progress reports what the benchmark does, on stderr.
	progress io.Writer
	// pooled connects to the benchmark's database through the PgBouncer of
	// modePooled; nil when no mode runs through it.
	pooled *pgxpool.Config
}

func benchmark(ctx context.Context, opts *options, stdout, stderr io.Writer) error {
	quiet := slog.New(&lazyHandler{inner: slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})})
	// refund.Migrate and provider.Migrate log to the default logger.
	slog.SetDefault(quiet)
	srv, err := openServer(ctx, opts, quiet)
	if err != nil {
		return err
	}
	defer srv.stop(context.WithoutCancel(ctx))
	b := &bench{opts: opts, srv: srv, quiet: quiet, progress: stderr}
	if slices.Contains(opts.modes, modePooled) {
		cfg, stop, err := srv.startPgBouncer(ctx, srv.url)
		if err != nil {
			return err
		}
		defer stop()
		b.pooled = cfg
	}
	// The runtime samples an allocation per 512 KiB for the heap profile, and
	// this program links runtime/pprof, so the sampling is on unless turned
	// off: about 3 µs per refund (stack walks in runtime.mProf_Malloc), charged
	// to each mode by the bytes it allocates. Only -memprofile samples, and
	// only during the timed operations.
	runtime.MemProfileRate = 0
	if slices.Equal(opts.modes, []string{modeHistory}) {
		return b.history(ctx, stdout)
	}
	if opts.history > 0 {
		b.logf("history: inserting %d finished refund operations", opts.history)
		start := time.Now()
		if err := srv.fillHistory(ctx, benchClient, historyPrefix, opts.history, orderAmount, refundAmount); err != nil {
			return fmt.Errorf("history: %w", err)
		}
		b.logf("history: inserted and vacuumed in %s", time.Since(start).Round(time.Second))
	}

	if slices.Equal(opts.modes, []string{modeFairness}) {
		return b.fairness(ctx, stdout)
	}
	rep := newReport(stdout, opts, srv)
	for round := 1; round <= opts.rounds; round++ {
		modes := slices.Clone(opts.modes)
		if round%2 == 0 {
			// Every other round in reverse, so that a drift of the machine's
			// speed does not favour the modes that run first.
			slices.Reverse(modes)
		}
		for _, mode := range modes {
			r, err := b.runMode(ctx, mode, round)
			if err != nil {
				return fmt.Errorf("%s: %w", mode, err)
			}
			rep.add(r)
		}
	}
	rep.finish()
	return nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

// runMode prepares a mode's orders and env, and measures it.
func (b *bench) runMode(ctx context.Context, mode string, round int) (*result, error) {
	n, w := b.opts.n, b.opts.warmup
	prefix := mode + "-"
	if round > 1 {
		prefix = fmt.Sprintf("%s-r%d-", mode, round)
	}
	b.logf("%s: creating %d orders", mode, n+w)
	if err := b.srv.createOrders(ctx, benchClient, prefix, n+w, orderAmount); err != nil {
		return nil, err
	}
	var (
		e   *env
		op  func(ctx context.Context, i int) error
		err error
	)
	switch mode {
	case modeBaseline:
		if e, err = b.newEnv(ctx, false, false); err != nil {
			return nil, err
		}
		bl := &baseline{pool: e.app, provider: e.provider, q: benchdb.New()}
		op = func(ctx context.Context, i int) error {
			return bl.refund(ctx, benchClient, key(prefix, i), key(prefix, i), refundAmount)
		}

	case modeEngine:
		if e, err = b.newEnv(ctx, true, true); err != nil {
			return nil, err
		}
		op = func(ctx context.Context, i int) error { return engineRefund(ctx, e, prefix, i) }

	case modePooled:
		if e, err = b.newEnvWith(ctx, envConfig{conns: b.opts.c, withEngine: true, workers: true, pooled: true}); err != nil {
			return nil, err
		}
		op = func(ctx context.Context, i int) error { return engineRefund(ctx, e, prefix, i) }

	case modeMetrics:
		m, err := idemflowprom.New(prometheus.NewRegistry(), nil)
		if err != nil {
			return nil, err
		}
		if e, err = b.newEnv(ctx, true, true, m.Observer()); err != nil {
			return nil, err
		}
		op = func(ctx context.Context, i int) error { return engineRefund(ctx, e, prefix, i) }

	case modeHTTP:
		if e, err = b.newEnv(ctx, true, true); err != nil {
			return nil, err
		}
		url, err := b.serveAPI(e)
		if err != nil {
			e.close(ctx)
			return nil, err
		}
		client := &http.Client{Transport: &http.Transport{
			MaxIdleConns:        2 * b.opts.c,
			MaxIdleConnsPerHost: 2 * b.opts.c,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}}
		e.closers = append(e.closers, func(context.Context) { client.CloseIdleConnections() })
		op = func(ctx context.Context, i int) error { return httpRefund(ctx, client, url, prefix, i) }

	case modeReplay:
		// Replays need no River worker; the refunds they replay run first, untimed.
		if e, err = b.newEnv(ctx, true, false); err != nil {
			return nil, err
		}
		b.logf("%s: running %d refunds to replay", mode, n+w)
		if failed, err := drive(ctx, 0, n+w, b.opts.c, func(ctx context.Context, i int) error {
			return engineRefund(ctx, e, prefix, i)
		}, nil); err != nil {
			e.close(ctx)
			return nil, fmt.Errorf("%d refunds to replay failed; the first: %w", failed, err)
		}
		op = func(ctx context.Context, i int) error { return replay(ctx, e, prefix, i) }

	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	r, err := b.measure(ctx, mode, e, op)
	if r != nil {
		r.Round = round
	}
	return r, err
}

// key returns the idempotency key, and the order id, of operation i of a mode.
func key(prefix string, i int) string {
	return prefix + strconv.Itoa(i+1)
}

func engineRefund(ctx context.Context, e *env, prefix string, i int) error {
	k := key(prefix, i)
	// A starter that waits for the answer says so (StartOpts.Wait): it is
	// woken once, with it.
	started, err := engine.Start(ctx, e.eng, e.wf.Refund, benchClient, k,
		refund.RefundInput{Client: benchClient, OrderID: k, Amount: refundAmount}, &engine.StartOpts{Wait: time.Minute})
	if err != nil {
		return err
	}
	if !started.Created {
		return fmt.Errorf("key %s was taken", k)
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

func httpRefund(ctx context.Context, client *http.Client, url, prefix string, i int) error {
	k := key(prefix, i)
	body := `{"orderId":"` + k + `","amount":` + strconv.Itoa(refundAmount) + `}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiToken)
	req.Header.Set(idempotency.HeaderKey, k)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%w: POST /refunds %s answered %d: %s", errStatus, k, resp.StatusCode, raw)
	}
	return nil
}

// replay is what a retry of a finished refund costs the engine: a Start with
// the same input, whose reservation finds the key taken, the read of the
// operation that holds it, and the decoding of its stored result.
func replay(ctx context.Context, e *env, prefix string, i int) error {
	k := key(prefix, i)
	started, err := engine.Start(ctx, e.eng, e.wf.Refund, benchClient, k,
		refund.RefundInput{Client: benchClient, OrderID: k, Amount: refundAmount}, nil)
	if err != nil {
		return err
	}
	if started.Created {
		return fmt.Errorf("key %s was free", k)
	}
	info := started.Existing
	if info.Status != engine.StatusSucceeded {
		return fmt.Errorf("refund %s is %s", k, info.Status)
	}
	if _, err := e.wf.Refund.Result(info); err != nil {
		return fmt.Errorf("result of %s: %w", k, err)
	}
	return nil
}

// measure warms a mode up, then times n operations at the set concurrency, and
// reads what they cost. It closes e.
func (b *bench) measure(ctx context.Context, mode string, e *env, op func(ctx context.Context, i int) error) (*result, error) {
	defer e.close(ctx)
	n, w, c := b.opts.n, b.opts.warmup, b.opts.c

	// The warm-up uses the operations after the timed ones: it opens the
	// connections and fills their statement caches.
	b.logf("%s: warming up with %d operations", mode, w)
	if failed, err := drive(ctx, n, n+w, c, op, nil); err != nil {
		return nil, fmt.Errorf("warm-up: %d operations failed; the first: %w", failed, err)
	}
	if _, err := b.srv.flushIdle(ctx, e.app, e.prov); err != nil {
		return nil, err
	}
	if err := b.awaitQuiet(ctx, mode); err != nil {
		return nil, err
	}
	before, err := b.srv.readStats(ctx, false)
	if err != nil {
		return nil, err
	}
	appBefore, provBefore := e.appCount.snapshot(), e.provCount.snapshot()

	b.logf("%s: timing %d operations at concurrency %d", mode, n, c)
	lat := make([]float32, n)
	stopProfile, err := b.startProfile(mode)
	if err != nil {
		return nil, err
	}
	cpuBefore := sampleCPU(b.srv.postmasterPID)
	allocsBefore := readAllocs()
	start := time.Now()
	failed, firstErr := drive(ctx, 0, n, c, op, lat)
	elapsed := time.Since(start)
	allocs := readAllocs().since(allocsBefore)
	cpu := sampleCPU(b.srv.postmasterPID).since(cpuBefore, n)
	if err := stopProfile(); err != nil {
		return nil, err
	}
	app := e.appCount.snapshot().since(appBefore)
	prov := e.provCount.snapshot().since(provBefore)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if failed == int64(n) {
		return nil, fmt.Errorf("every operation failed; the first: %w", firstErr)
	}
	if failed > 0 {
		b.logf("%s: %d of %d operations failed; the first: %v", mode, failed, n, firstErr)
	}

	e.close(ctx)
	after, err := b.srv.readStats(ctx, true)
	if err != nil {
		return nil, err
	}
	return newResult(mode, b.opts, lat, failed, elapsed, cpu, allocs, after.since(before), app, prov), nil
}

// Quiet is under quietBusy of the machine's CPU time used by other programs
// (this process and its cluster left out when known) over quietWindow. An idle
// virtual machine shows several percent of kernel time charged to no process.
const (
	quietBusy   = 0.20
	quietWindow = 2 * time.Second
)

// awaitQuiet waits, up to -wait-quiet, until the machine is quiet, so that other
// programs do not share the CPUs with the timed operations.
func (b *bench) awaitQuiet(ctx context.Context, mode string) error {
	if b.opts.waitQuiet <= 0 {
		return nil
	}
	deadline := time.Now().Add(b.opts.waitQuiet)
	for {
		s0 := sampleCPU(b.srv.postmasterPID)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietWindow):
		}
		u := sampleCPU(b.srv.postmasterPID).since(s0, 1)
		busy := u.others
		if busy < 0 {
			busy = u.machineBusy
		}
		switch {
		case busy < 0: // not measured here
			return nil
		case busy < quietBusy:
			return nil
		case time.Now().After(deadline):
			b.logf("%s: other programs still use %.0f%% of the CPUs; timing anyway", mode, 100*busy)
			return nil
		}
		b.logf("%s: waiting for a quiet machine (other programs use %.0f%% of the CPUs)", mode, 100*busy)
	}
}

// startProfile starts the CPU profile, the allocation profile and the
// execution trace of a mode's timed operations, each if asked. Allocations are
// sampled only during timed operations, but the runtime's profile adds them up
// over the process: a mode's holds those of the modes timed before it too.
func (b *bench) startProfile(mode string) (stop func() error, err error) {
	var stops []func() error
	stopAll := func() error {
		var errs []error
		for _, stop := range stops {
			errs = append(errs, stop())
		}
		return errors.Join(errs...)
	}
	if b.opts.cpuProfile != "" {
		stop, err := startWriting(b.opts.cpuProfile+"."+mode+".pprof", "cpu profile", pprof.StartCPUProfile, pprof.StopCPUProfile)
		if err != nil {
			return nil, err
		}
		stops = append(stops, stop)
	}
	if b.opts.memProfile != "" {
		runtime.MemProfileRate = 1
		stops = append(stops, func() error {
			runtime.MemProfileRate = 0
			// The profile holds what the last completed GC cycle saw.
			runtime.GC()
			f, err := os.Create(b.opts.memProfile + "." + mode + ".allocs.pprof")
			if err != nil {
				return fmt.Errorf("memory profile: %w", err)
			}
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				_ = f.Close()
				return fmt.Errorf("memory profile: %w", err)
			}
			return f.Close()
		})
	}
	if b.opts.trace != "" {
		stop, err := startWriting(b.opts.trace+"."+mode+".trace", "trace", trace.Start, trace.Stop)
		if err != nil {
			_ = stopAll()
			return nil, err
		}
		stops = append(stops, stop)
	}
	return stopAll, nil
}

// startWriting creates path and starts writing what (a profile, a trace) to it
// with start; the function it returns stops and closes the file.
func startWriting(path, what string, start func(io.Writer) error, stop func()) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := start(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return func() error {
		stop()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}, nil
}

// drive runs op for i in [from, to) with up to c at once. When lat is not nil it
// records the latency of op(from+k) in lat[k], in milliseconds. It returns how
// many failed, and the first error.
//
// Each of the c workers runs its operations under one context of its own, which
// a watchdog cancels when an operation has run for opTimeout; the worker then
// makes a new one. A context.WithTimeout per operation (a timer made, armed and
// stopped, 4 allocations) cost about 3 µs per refund, charged to every mode.
func drive(ctx context.Context, from, to, c int, op func(ctx context.Context, i int) error, lat []float32) (int64, error) {
	var (
		next, failed atomic.Int64
		once         sync.Once
		first        error
		wg           sync.WaitGroup
	)
	workers := make([]opWorker, min(c, to-from))
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		watch(workers, stopWatch)
	}()
	for w := range workers {
		wk := &workers[w]
		wg.Go(func() {
			opCtx := wk.newContext(ctx)
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= to-from {
					break
				}
				if opCtx.Err() != nil {
					opCtx = wk.newContext(ctx) // the watchdog cancelled the last one
				}
				t0 := time.Now()
				wk.started.Store(t0.UnixNano())
				err := op(opCtx, from+k)
				d := time.Since(t0)
				wk.started.Store(0)
				if lat != nil {
					lat[k] = float32(d.Seconds() * 1000)
				}
				if err != nil {
					failed.Add(1)
					once.Do(func() { first = err })
				}
			}
			wk.stop()
		})
	}
	wg.Wait()
	close(stopWatch)
	<-watchDone
	if err := ctx.Err(); err != nil {
		return failed.Load(), err
	}
	return failed.Load(), first
}

// opWorker is one of drive's workers, as its watchdog sees it.
type opWorker struct {
	// started is when the worker's operation started, in Unix nanoseconds, or
	// 0 between operations.
	started atomic.Int64
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
}

// newContext makes the context of the worker's next operations.
func (w *opWorker) newContext(parent context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	w.mu.Lock()
	w.cancel = cancel
	w.mu.Unlock()
	return ctx
}

// expire cancels the worker's context if its operation started before
// deadline.
func (w *opWorker) expire(deadline time.Time) {
	if s := w.started.Load(); s == 0 || s > deadline.UnixNano() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel(fmt.Errorf("%w: the operation ran for more than %s", context.DeadlineExceeded, opTimeout))
}

func (w *opWorker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel(nil)
}

// watch cancels, once a second, the operations of workers that have run for
// opTimeout, until stop is closed.
func watch(workers []opWorker, stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			for i := range workers {
				workers[i].expire(now.Add(-opTimeout))
			}
		}
	}
}
