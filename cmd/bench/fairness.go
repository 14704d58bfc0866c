package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund"
)

// modeFairness measures Config.MaxInFlightPerScope: one heavy client offering
// fairHeavyTimes the rate of each of fairLights light ones, on a process whose
// MaxInFlight the offered load exceeds. It runs alone (not in -mode all): its
// figures are of clients, not of a refund's cost.
//
// Each client offers a fixed rate through a fixed number of workers (its
// connections, say): each worker sends one refund every interval (workers over
// rate), from a phase of its own, and waits for its end before the next; a
// worker that falls behind sends its next at once. A refund refused with
// ErrOverloaded or ErrScopeBusy (503 or 429 over HTTP) is sent again with the
// same key after the retry delay, jittered by ±50%, as a client does after
// Retry-After. A refund's latency runs from the time its worker was to send
// it, which is its first try unless the worker was behind, to its operation's
// end: a client that falls behind is charged for it, not hidden.
//
// The provider answers after -provider-latency (20 ms by default), as one
// across a network does: then the process's MaxInFlight runs are what the
// clients contend for. With a provider that answers at once, as in the other
// modes, a refund is about a millisecond of CPU and this 2-core machine's CPUs
// saturate with 3 or 4 refunds in flight, well below any MaxInFlight: a bound
// on runs then does not bound a client's share of the CPUs.
//
// Three scenarios, each on an engine of its own: "alone" (the light clients
// only, with the per-scope bound: it bounds their own bursts, as in "after"),
// "before" (the heavy client too, no per-scope bound) and "after" (the heavy
// client too, with the per-scope bound). Each
// is warmed up with its own load for fairWarmup, then timed for -duration: a
// refund counts in a client's throughput when it ends in that window, and in
// the light clients' latency when it was to be sent in it. At the window's end
// the clients stop sending; the heavy client gives up its refused refunds,
// and the light ones' go on for up to fairDrain (those left count as
// unfinished, with the latency they had so far).
//
// The light clients' share is min(their offered rate, capacity/5), where the
// capacity is what the saturated process did in "before", all clients
// together.
const (
	modeFairness = "fairness"
	// fairLights is the number of light clients; fairHeavyTimes, how many times
	// the rate of each the heavy one offers.
	fairLights     = 4
	fairHeavyTimes = 20
	// fairLightWorkers is how many requests a light client may have
	// outstanding; the heavy client has twice MaxInFlight, enough to fill the
	// process alone with some of them waiting to retry.
	fairLightWorkers = 4
	fairWarmup       = 2 * time.Second
	fairDrain        = 10 * time.Second
)

// fairOptions are -mode fairness's options.
type fairOptions struct {
	duration    time.Duration
	maxInFlight int
	// perScope is the engine's MaxInFlightPerScope in the "alone" and "after"
	// scenarios.
	perScope int
	// rate is what each light client offers, in refunds per second.
	rate       float64
	retryDelay time.Duration
	// providerLatency delays every call to the provider.
	providerLatency time.Duration
}

func (f *fairOptions) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "fairness: how long each scenario is timed, after a 2 s warm-up")
	fs.IntVar(&f.maxInFlight, "max-in-flight", 16, "fairness: the engine's MaxInFlight, the process's bound on the refunds it runs at once")
	fs.IntVar(&f.perScope, "max-in-flight-per-scope", 0, "fairness: the engine's MaxInFlightPerScope in the alone and after scenarios (0: max-in-flight/5, at least 1)")
	fs.Float64Var(&f.rate, "rate", 50, "fairness: the refunds per second that each light client offers; the heavy client offers 20 times as many")
	fs.DurationVar(&f.providerLatency, "provider-latency", 20*time.Millisecond, "fairness: how long the provider takes to answer each call (0: at once, as in the other modes)")
	fs.DurationVar(&f.retryDelay, "retry-delay", 20*time.Millisecond, "fairness: how long a client waits, jittered by ±50%, before it sends a refused refund again with the same key")
}

// check checks f, and sets perScope's default.
func (f *fairOptions) check() error {
	switch {
	case f.duration < 100*time.Millisecond:
		return errors.New("-duration must be at least 100ms")
	case f.maxInFlight < 1:
		return errors.New("-max-in-flight must be at least 1")
	case f.perScope < 0:
		return errors.New("-max-in-flight-per-scope must not be negative")
	case !(f.rate > 0) || f.rate > 100_000:
		return errors.New("-rate must be positive, and at most 100000")
	case f.retryDelay <= 0:
		return errors.New("-retry-delay must be positive")
	case f.providerLatency < 0 || f.providerLatency > time.Minute:
		return errors.New("-provider-latency must be between 0 and 1m")
	}
	if f.perScope == 0 {
		f.perScope = max(1, f.maxInFlight/(fairLights+1))
	}
	return nil
}

// fairScenario is one of the fairness mode's runs.
type fairScenario struct {
	name  string
	heavy bool
	// perScope is the engine's MaxInFlightPerScope (0: no bound).
	perScope int
}

// fairResult is a scenario's figures.
type fairResult struct {
	Mode        string  `json:"mode"`
	Round       int     `json:"round"`
	Scenario    string  `json:"scenario"`
	MaxInFlight int     `json:"max_in_flight"`
	PerScope    int     `json:"max_in_flight_per_scope"`
	Seconds     float64 `json:"seconds"`
	// LightRate and HeavyRate are what each light client, and the heavy one
	// (0 when absent), offer per second.
	LightRate float64 `json:"light_rate"`
	HeavyRate float64 `json:"heavy_rate"`
	// The light clients' latency, all four together, from when each refund
	// was due (its first try, unless its worker was behind), and from its
	// first try.
	LightP50ms         float64 `json:"light_p50_ms"`
	LightP99ms         float64 `json:"light_p99_ms"`
	LightMaxMs         float64 `json:"light_max_ms"`
	LightFirstTryP50ms float64 `json:"light_first_try_p50_ms"`
	LightFirstTryP99ms float64 `json:"light_first_try_p99_ms"`
	// LightOpsPerS is a light client's throughput, the mean of the four, and
	// LightMinOpsPerS the lowest.
	LightOpsPerS    float64 `json:"light_ops_per_s"`
	LightMinOpsPerS float64 `json:"light_min_ops_per_s"`
	HeavyOpsPerS    float64 `json:"heavy_ops_per_s"`
	TotalOpsPerS    float64 `json:"total_ops_per_s"`
	// Refusals (ErrOverloaded or ErrScopeBusy) per second.
	LightRefusalsPerS float64 `json:"light_refusals_per_s"`
	HeavyRefusalsPerS float64 `json:"heavy_refusals_per_s"`
	// LightUnfinished counts the light refunds of the window not finished
	// fairDrain after it; Errors, the refunds of the window that failed.
	LightUnfinished int64 `json:"light_unfinished"`
	Errors          int64 `json:"errors"`
	// OthersCPUPct is the share of the machine's CPU that other programs
	// used in the window (-1: not known).
	OthersCPUPct float64 `json:"others_cpu_pct"`

	// Of the round, once its scenarios have run: the light clients' p99 over
	// their p99 alone, their share, and their throughput over it.
	P99VsAlone float64 `json:"p99_vs_alone"`
	Share      float64 `json:"share"`
	OfShare    float64 `json:"of_share"`
}

// fairClient is one client of a scenario: its scope, its orders and what it
// counted.
type fairClient struct {
	name     string
	heavy    bool
	workers  int
	rate     float64
	interval time.Duration
	prefix   string
	orders   int
	next     atomic.Int64

	done, refused, failed, unfinished atomic.Int64

	// lat holds the latencies of the light refunds of the window, in
	// milliseconds, from when they were due; fromFirst, from their first try.
	mu             sync.Mutex
	lat, fromFirst []float32
}

func (c *fairClient) record(due, first, end time.Time) {
	c.mu.Lock()
	c.lat = append(c.lat, float32(end.Sub(due).Seconds()*1000))
	c.fromFirst = append(c.fromFirst, float32(end.Sub(first).Seconds()*1000))
	c.mu.Unlock()
}

// fairRun is a scenario while it runs.
type fairRun struct {
	e          *env
	retryDelay time.Duration
	// start is when the workers start, from when the window opens, to when
	// it closes and the clients stop sending.
	start, from, to time.Time

	firstErr struct {
		once sync.Once
		err  error
	}
}

func (r *fairRun) inWindow(t time.Time) bool { return !t.Before(r.from) && t.Before(r.to) }

func (r *fairRun) fail(err error) {
	r.firstErr.once.Do(func() { r.firstErr.err = err })
}

// fairness runs the scenarios -rounds times and prints their figures.
func (b *bench) fairness(ctx context.Context, stdout io.Writer) error {
	f := b.opts.fair
	scenarios := []fairScenario{
		{name: "alone", perScope: f.perScope},
		{name: "before", heavy: true},
		{name: "after", heavy: true, perScope: f.perScope},
	}
	if !b.opts.json {
		s := b.srv.settings
		fmt.Fprintf(stdout, "PostgreSQL %s (fsync=%s, synchronous_commit=%s), database %s\n", s.ServerVersion, s.Fsync, s.SynchronousCommit, b.srv.dbName)
		fmt.Fprintf(stdout, "fairness: MaxInFlight %d; %d light clients at %.0f refunds/s each (%d workers), a heavy one at %.0f/s (%d workers); "+
			"MaxInFlightPerScope %d alone and after; provider latency %s; refused refunds retried after %s ±50%%; %s warm-up, %s timed per scenario\n\n",
			f.maxInFlight, fairLights, f.rate, fairLightWorkers, fairHeavyTimes*f.rate, 2*f.maxInFlight,
			f.perScope, f.providerLatency, f.retryDelay, fairWarmup, f.duration)
	}
	var all []*fairResult
	for round := 1; round <= b.opts.rounds; round++ {
		var rs []*fairResult
		for _, sc := range scenarios {
			r, err := b.fairScenario(ctx, round, sc)
			if err != nil {
				return fmt.Errorf("fairness %s: %w", sc.name, err)
			}
			rs = append(rs, r)
		}
		fairCompare(rs[0], rs[1], rs...)
		if b.opts.json {
			for _, r := range rs {
				line, err := json.Marshal(r)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%s\n", line)
			}
		}
		all = append(all, rs...)
	}
	if !b.opts.json {
		printFairness(stdout, all)
	}
	return nil
}

// fairCompare sets, in each of rs, the light clients' p99 over theirs alone,
// their share (min of their offered rate and a fifth of what the saturated
// process did in before) and their throughput over it.
func fairCompare(alone, before *fairResult, rs ...*fairResult) {
	capacity := before.TotalOpsPerS
	for _, r := range rs {
		if alone.LightP99ms > 0 {
			r.P99VsAlone = round(r.LightP99ms/alone.LightP99ms, 2)
		}
		r.Share = round(min(r.LightRate, capacity/(fairLights+1)), 1)
		if r.Share > 0 {
			r.OfShare = round(r.LightOpsPerS/r.Share, 3)
		}
	}
}

func printFairness(w io.Writer, rs []*fairResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tscenario\tper-scope cap\tlight p50 ms\tlight p99 ms\tp99/alone\tp99 from first try\tlight ops/s each\t(lowest)\tshare\tof share\theavy ops/s\ttotal ops/s\tlight refusals/s\theavy refusals/s\tunfinished\terrors\tothers' CPU %\t")
	for _, r := range rs {
		scope, heavy := "off", "-"
		if r.PerScope > 0 {
			scope = fmt.Sprint(r.PerScope)
		}
		if r.HeavyRate > 0 {
			heavy = fmt.Sprintf("%.0f", r.HeavyOpsPerS)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t%.3f\t%s\t%.0f\t%.0f\t%.0f\t%d\t%d\t%.1f\t\n",
			r.Round, r.Scenario, scope, r.LightP50ms, r.LightP99ms, r.P99VsAlone, r.LightFirstTryP99ms, r.LightOpsPerS, r.LightMinOpsPerS,
			r.Share, r.OfShare, heavy, r.TotalOpsPerS, r.LightRefusalsPerS, r.HeavyRefusalsPerS, r.LightUnfinished, r.Errors, r.OthersCPUPct)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, r := range rs {
		if r.Scenario != "after" {
			continue
		}
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "not met"
		}
		fmt.Fprintf(w, "round %d, after: light p99 %.2fx alone (goal: at most 2x): %s; light throughput %.3f of their share (goal: at least 0.9): %s\n",
			r.Round, r.P99VsAlone, verdict(r.P99VsAlone <= 2), r.OfShare, verdict(r.OfShare >= 0.9))
	}
	byScenario := map[string][]*fairResult{}
	var names []string
	for _, r := range rs {
		if byScenario[r.Scenario] == nil {
			names = append(names, r.Scenario)
		}
		byScenario[r.Scenario] = append(byScenario[r.Scenario], r)
	}
	if len(byScenario[names[0]]) < 2 {
		return
	}
	fmt.Fprintf(w, "\nmedians over %d rounds:\n", len(byScenario[names[0]]))
	for _, name := range names {
		v := byScenario[name]
		med := func(f func(*fairResult) float64) float64 {
			x := make([]float64, len(v))
			for i, r := range v {
				x[i] = f(r)
			}
			return medianOf(x)
		}
		fmt.Fprintf(w, "  %-6s light p50 %7.2f ms  p99 %7.2f ms (%.2fx alone)  %.3f of share  heavy %4.0f ops/s  total %4.0f ops/s\n", name,
			med(func(r *fairResult) float64 { return r.LightP50ms }), med(func(r *fairResult) float64 { return r.LightP99ms }),
			med(func(r *fairResult) float64 { return r.P99VsAlone }), med(func(r *fairResult) float64 { return r.OfShare }),
			med(func(r *fairResult) float64 { return r.HeavyOpsPerS }), med(func(r *fairResult) float64 { return r.TotalOpsPerS }))
	}
}

// fairScenario runs one scenario on an engine of its own.
func (b *bench) fairScenario(ctx context.Context, rnd int, sc fairScenario) (*fairResult, error) {
	f := b.opts.fair
	var clients []*fairClient
	for i := range fairLights {
		clients = append(clients, &fairClient{name: fmt.Sprintf("light-%d", i+1), workers: fairLightWorkers, rate: f.rate})
	}
	if sc.heavy {
		clients = append(clients, &fairClient{name: "heavy", heavy: true, workers: 2 * f.maxInFlight, rate: fairHeavyTimes * f.rate})
	}
	workers, orders := 0, 0
	span := (fairWarmup + f.duration).Seconds()
	for _, c := range clients {
		c.interval = time.Duration(float64(c.workers) / c.rate * float64(time.Second))
		c.prefix = fmt.Sprintf("fair-r%d-%s-%s-", rnd, sc.name, c.name)
		// Each worker sends at most span/interval + 1 refunds.
		c.orders = int(math.Ceil(c.rate*span)) + c.workers
		workers += c.workers
		orders += c.orders
	}
	b.logf("fairness %s: creating %d orders", sc.name, orders)
	for _, c := range clients {
		if err := b.srv.createOrders(ctx, c.name, c.prefix, c.orders, orderAmount); err != nil {
			return nil, err
		}
	}
	e, err := b.newEnvWith(ctx, envConfig{
		conns: workers, withEngine: true, workers: true, providerLatency: f.providerLatency,
		engine: func(cfg *engine.Config) {
			cfg.MaxInFlight = f.maxInFlight
			cfg.MaxInFlightPerScope = sc.perScope
		},
	})
	if err != nil {
		return nil, err
	}
	defer e.close(ctx)
	if err := b.awaitQuiet(ctx, "fairness "+sc.name); err != nil {
		return nil, err
	}

	r := &fairRun{e: e, retryDelay: f.retryDelay, start: time.Now().Add(50 * time.Millisecond)}
	r.from = r.start.Add(fairWarmup)
	r.to = r.from.Add(f.duration)
	// The heavy client gives up when the window closes; the light ones finish
	// what they sent, for up to fairDrain.
	heavyCtx, cancelHeavy := context.WithDeadline(ctx, r.to)
	defer cancelHeavy()
	lightCtx, cancelLight := context.WithDeadline(ctx, r.to.Add(fairDrain))
	defer cancelLight()

	b.logf("fairness %s: %s of warm-up, then %s timed", sc.name, fairWarmup, f.duration)
	var wg sync.WaitGroup
	for _, c := range clients {
		cctx := lightCtx
		if c.heavy {
			cctx = heavyCtx
		}
		// The workers' phases spread evenly over the interval, from a random
		// offset per client.
		offset := time.Duration(rand.Int64N(int64(c.interval)/int64(c.workers) + 1))
		for w := range c.workers {
			phase := offset + c.interval*time.Duration(w)/time.Duration(c.workers)
			wg.Go(func() { r.work(cctx, c, phase) })
		}
	}
	cpu, err := b.fairWindow(ctx, sc, r)
	if err != nil {
		cancelHeavy()
		cancelLight()
	}
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.close(ctx)

	res := &fairResult{
		Mode: modeFairness, Round: rnd, Scenario: sc.name,
		MaxInFlight: f.maxInFlight, PerScope: sc.perScope,
		Seconds: f.duration.Seconds(), LightRate: f.rate,
		LightMinOpsPerS: math.Inf(1), OthersCPUPct: -1,
	}
	if cpu.others >= 0 {
		res.OthersCPUPct = round(100*cpu.others, 1)
	}
	secs := f.duration.Seconds()
	var lat, fromFirst []float32
	var lightDone, lightRefused, total int64
	for _, c := range clients {
		done := c.done.Load()
		total += done
		res.Errors += c.failed.Load()
		if c.heavy {
			res.HeavyRate = c.rate
			res.HeavyOpsPerS = round(float64(done)/secs, 1)
			res.HeavyRefusalsPerS = round(float64(c.refused.Load())/secs, 1)
			continue
		}
		lat = append(lat, c.lat...)
		fromFirst = append(fromFirst, c.fromFirst...)
		lightDone += done
		lightRefused += c.refused.Load()
		res.LightUnfinished += c.unfinished.Load()
		res.LightMinOpsPerS = min(res.LightMinOpsPerS, round(float64(done)/secs, 1))
	}
	res.LightOpsPerS = round(float64(lightDone)/fairLights/secs, 1)
	res.LightRefusalsPerS = round(float64(lightRefused)/secs, 1)
	res.TotalOpsPerS = round(float64(total)/secs, 1)
	if len(lat) == 0 {
		return nil, fmt.Errorf("no light refund was sent in the window; the first error: %w", r.firstErr.err)
	}
	slices.Sort(lat)
	res.LightP50ms = percentile(lat, 0.50)
	res.LightP99ms = percentile(lat, 0.99)
	res.LightMaxMs = round(float64(lat[len(lat)-1]), 3)
	slices.Sort(fromFirst)
	res.LightFirstTryP50ms = percentile(fromFirst, 0.50)
	res.LightFirstTryP99ms = percentile(fromFirst, 0.99)
	if res.Errors > 0 {
		b.logf("fairness %s: %d refunds failed; the first: %v", sc.name, res.Errors, r.firstErr.err)
	}
	b.logf("fairness %s: light p50 %.2f ms, p99 %.2f ms, %.1f ops/s each; heavy %.0f ops/s; total %.0f ops/s",
		sc.name, res.LightP50ms, res.LightP99ms, res.LightOpsPerS, res.HeavyOpsPerS, res.TotalOpsPerS)
	return res, nil
}

// fairWindow waits for r's window, and measures what the machine's CPUs did
// in it, with the profiles that the options ask for.
func (b *bench) fairWindow(ctx context.Context, sc fairScenario, r *fairRun) (cpuUse, error) {
	if !sleepUntil(ctx, r.from) {
		return cpuUse{}, ctx.Err()
	}
	stopProfile, err := b.startProfile(modeFairness + "-" + sc.name)
	if err != nil {
		return cpuUse{}, err
	}
	s0 := sampleCPU(b.srv.postmasterPID)
	slept := sleepUntil(ctx, r.to)
	cpu := sampleCPU(b.srv.postmasterPID).since(s0, 1)
	if err := stopProfile(); err != nil {
		return cpuUse{}, err
	}
	if !slept {
		return cpuUse{}, ctx.Err()
	}
	return cpu, nil
}

// work is one worker of client c: from start+phase, one refund every
// c.interval until the window closes.
func (r *fairRun) work(ctx context.Context, c *fairClient, phase time.Duration) {
	for next := r.start.Add(phase); next.Before(r.to); next = next.Add(c.interval) {
		if !sleepUntil(ctx, next) {
			return
		}
		n := int(c.next.Add(1))
		if n > c.orders {
			return // not reached: the orders cover every worker's schedule
		}
		r.refund(ctx, c, key(c.prefix, n-1), next)
	}
}

// refund sends refund k of client c until it is not refused, and waits for
// its end; due is when the worker was to send it.
func (r *fairRun) refund(ctx context.Context, c *fairClient, k string, due time.Time) {
	timed := r.inWindow(due)
	in := refund.RefundInput{Client: c.name, OrderID: k, Amount: refundAmount}
	first := time.Now()
	for {
		started, err := engine.Start(ctx, r.e.eng, r.e.wf.Refund, c.name, k, in, nil)
		if errors.Is(err, engine.ErrOverloaded) || errors.Is(err, engine.ErrScopeBusy) {
			if r.inWindow(time.Now()) {
				c.refused.Add(1)
			}
			jittered := time.Duration(float64(r.retryDelay) * (0.5 + rand.Float64()))
			if sleepUntil(ctx, time.Now().Add(jittered)) {
				continue
			}
			err = ctx.Err()
		}
		if err == nil && !started.Created {
			err = fmt.Errorf("key %s was taken", k)
		}
		if err == nil {
			var info *engine.Info
			if info, err = started.Wait(ctx); err == nil && info.Status != engine.StatusSucceeded {
				err = fmt.Errorf("refund %s ended %s: %v", k, info.Status, info.Error)
			}
		}
		end := time.Now()
		switch {
		case err == nil:
			if r.inWindow(end) {
				c.done.Add(1)
			}
		case ctx.Err() != nil:
			// The client stopped waiting: the heavy one when the window
			// closed, a light one when the drain ended.
			if !c.heavy && timed {
				c.unfinished.Add(1)
			}
		default:
			if timed {
				c.failed.Add(1)
				r.fail(err)
			}
		}
		if timed && !c.heavy && (err == nil || ctx.Err() != nil) {
			c.record(due, first, end)
		}
		return
	}
}

// sleepUntil sleeps until t, and reports whether ctx was still alive then.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
