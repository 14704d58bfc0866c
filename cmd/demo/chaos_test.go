package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/workflows/refund"
)

var (
	chaosDuration = flag.Duration("chaos.duration", 8*time.Second,
		"how long TestChaos injects faults; the long form is -chaos.duration=5m")
	chaosSeed = flag.Uint64("chaos.seed", 0,
		"seed of TestChaos's random choices; 0 picks one, which the test logs (timing still differs between runs)")
)

const (
	// chaosProcesses is how many demos serve the database at once.
	chaosProcesses = 2
	// chaosWorkers is how many client goroutines create orders and refund them.
	chaosWorkers = 4
	// chaosRecovery bounds how long after the faults stop every key has to reach
	// its final answer.
	chaosRecovery = 60 * time.Second
)

// The clients of the chaos: the demo's default ones, by token.
var chaosClients = []struct{ name, token string }{{"merchant-a", tokenA}, {"merchant-b", tokenB}}

// TestChaos attacks two demo processes, which share a database on a PostgreSQL
// cluster of the test's own, the way production does, for -chaos.duration, all at
// once and at random:
//
//   - SIGKILL of one of the demos every 0.5 to 3 seconds, restarted at once;
//   - provider faults (error, lost_response, slow, pending, lagging_lookup,
//     lookup_error) through /provider/faults: slow answers outlast the demos'
//     -provider-timeout (500ms) and land late, within -provider-settle (4s);
//     pending refunds settle succeeded or failed later, told by webhook or
//     found by lookup; a lagging lookup finds nothing for a while under the
//     key of a refund made, whose event comes at once;
//   - PostgreSQL restarted (fast shutdown, then start) every 3 to 12 seconds;
//   - faults of the network between the demos and PostgreSQL, through a proxy
//     of the test's (faultProxy): latency spikes (every byte delayed 50 to 300
//     ms for 1 to 3 seconds), resets of a random share of the connections
//     (both sides, abruptly), and stalls of 2 to 4 seconds (nothing forwarded,
//     the connections kept open);
//   - clients that create orders (some of them DECLINE- orders) and refund them
//     under idempotency keys, retry each key after cut connections, server errors
//     and short client timeouts until its final answer, resend a key
//     concurrently, with only metadata changed (the same request), and with a
//     different amount (which must get 422 idempotency_key_reused);
//   - the entry points beyond HTTP (chaos_entry_test.go): queued orders, each
//     delivered twice and sent again by its producer until consumed; the
//     provider's webhook for every refund, and every event redelivered once or
//     twice at once every few seconds; a settlement every 2 seconds, fired by
//     both demos.
//
// When the faults stop, every key must reach its final answer within
// chaosRecovery. Then the books are checked, over HTTP and in the database: every
// key names one operation and got one answer, byte for byte on every replay; a
// 201 names exactly one succeeded refund; the provider made exactly one refund
// per succeeded refund, none for a failed one, never two under one derived key;
// per order, refunded = the sum of its succeeded refunds <= its amount; each
// client's balances sum to zero, the merchant's plus what settlements paid out =
// orders - refunds, each customer's = its refunds - its orders; every order and
// refund moved money once (a declined refund once, and once back); no operation
// is left in progress; every webhook event was delivered and applied once, and
// every succeeded refund confirmed; every settlement moved its amount once.
// Reconciliation (POST /admin/reconciliation/run) finds no mismatch, once
// halfway through the faults, with operations in flight, and once at the end,
// having read every refund the provider made.
//
// The test prints a report: operations, retries, kills, provider faults, database
// restarts, database proxy faults, duplicates found, operations lost, the longest
// recovery. The long form: go test ./cmd/demo -run TestChaos -chaos.duration=5m -v
func TestChaos(t *testing.T) {
	t.Parallel()
	if _, err := pgcluster.BinDir(); err != nil {
		pgcluster.SkipMissing(t, "no PostgreSQL server binaries: %v", err)
	}
	seed := *chaosSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("chaos seed %d (rerun with -chaos.seed=%d), %s of faults", seed, seed, *chaosDuration)
	run := newChaosRun(t, seed, chaosOpts{processes: chaosProcesses})
	run.start()
	run.inject(*chaosDuration)
	run.awaitFinalAnswers()
	run.check()
	run.report()
	run.stop()
}

// chaosRun is one run of TestChaos: the cluster, the demos, the clients' keys and
// what was counted.
type chaosRun struct {
	t      *testing.T
	rng    *rand.Rand // the driver's; each client goroutine has its own
	seed   uint64
	dir    string // the cluster's data and the demos' logs; kept when the test fails
	pgCfg  *pgcluster.Config
	dbURL  string // the cluster's, for the test's own reads
	port   int
	ctx    context.Context // ends when the test does
	http   *http.Client
	nDemos int // demos started, for their log files' names
	// stepFaults counts the demos started with each of chaosStepFaults.
	stepFaults map[string]int

	// proxy stands between the demos and the cluster (or its PgBouncer):
	// demoURL is dbURL through it.
	proxy   *faultProxy
	demoURL string
	opts    chaosOpts
	bouncer *pgcluster.PgBouncer // with opts.pooler
	// entry counts what the entry points did (chaos_entry_test.go).
	entry chaosEntryCounts

	mu      sync.Mutex
	demos   []*demo  // the running ones, opts.processes slots
	bases   []string // their base URLs, for the clients
	started []*demo  // every demo ever started
	keys    []*chaosKey
	events  []time.Time // kills, database restarts, and the proxy's resets and stalls
	faults  map[string]int
	// fiveXX counts the 5xx answers by status and error code.
	fiveXX  map[string]int
	problem []string // broken invariants
	dups    int      // of which: something done twice
	lost    int      // of which: something never done

	stopping    atomic.Bool // no new orders
	workers     sync.WaitGroup
	faultsStart time.Time
	faultsEnd   time.Time
	// midReconcile is what the reconciliation run asked for halfway through
	// the faults found, endReconcile the one at the end.
	midReconcile, endReconcile chaosReconcile
	// deadline is when every key must have its final answer, in Unix
	// nanoseconds; 0 while the faults go on.
	deadline atomic.Int64

	// Counters.
	requests, cut, timeouts, serverErrors, accepted, inProgress atomic.Int64
	concurrent, reuseChecks, replayChecks                       atomic.Int64
	kills, faultInjections, faultRequests, dbRestarts, exits    atomic.Int64
	spikes, resets, resetConns, stalls                          atomic.Int64
}

// chaosKey is one idempotency key of one client, and everything its requests got.
type chaosKey struct {
	client  int // index into chaosClients
	path    string
	key     string
	orderID string
	// customerID is set for an order.
	customerID string
	amount     int64

	first, done time.Time
	requests    int
	interrupted bool // a request was cut, timed out or got a 5xx
	opIDs       []string
	final       *response // the first final answer
	fresh       int       // final answers not marked Idempotent-Replayed
	stuck       string    // why the key got no final answer, if it did not
}

func (k *chaosKey) kind() string { return strings.TrimPrefix(k.path, "/") }

func (k *chaosKey) String() string {
	return fmt.Sprintf("%s %s key %s (%s, %d)", chaosClients[k.client].name, k.path, k.key, k.orderID, k.amount)
}

// body returns the request's body with metadata, which is not fingerprinted: the
// same request whatever it is. amountDelta changes the amount: another request.
func (k *chaosKey) body(metadata any, amountDelta int64) []byte {
	b := map[string]any{"orderId": k.orderID, "amount": k.amount + amountDelta}
	if k.customerID != "" {
		b["customerId"] = k.customerID
	}
	if metadata != nil {
		b["metadata"] = metadata
	}
	raw, err := json.Marshal(b)
	if err != nil {
		panic(err) // maps of strings and numbers always marshal
	}
	return raw
}

// chaosOpts are what TestChaos and TestChaosPooler run differently.
type chaosOpts struct {
	processes int // demos serving at once
	// pooler puts a PgBouncer in transaction mode (poolSize server
	// connections) between the proxy and the cluster, and runs the demos
	// with -pooler transaction.
	pooler   bool
	poolSize int
}

func newChaosRun(t *testing.T, seed uint64, opts chaosOpts) *chaosRun {
	// The data directory's parents must be searchable by the unprivileged user
	// that runs PostgreSQL when the tests run as root.
	dir, err := os.MkdirTemp("", "idemflow-chaos-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	r := &chaosRun{
		t: t, rng: rand.New(rand.NewPCG(seed, 0)), seed: seed, dir: dir, ctx: t.Context(),
		pgCfg: &pgcluster.Config{
			DataDir: filepath.Join(dir, "pg"),
			Logger:  slog.New(slog.DiscardHandler),
			// A fast shutdown checkpoints: durability is not what is tested.
			Settings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"},
		},
		faults: map[string]int{}, stepFaults: map[string]int{}, fiveXX: map[string]int{},
		opts: opts, demos: make([]*demo, opts.processes),
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 64, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	r.http = &http.Client{Transport: transport}
	t.Cleanup(func() {
		// Cleanups run last in, first out: this one runs after the demos' and
		// the workers'.
		transport.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := pgcluster.Stop(ctx, r.pgCfg)
		require.NoError(t, err)
		if t.Failed() {
			t.Logf("kept the cluster's data and the demos' logs in %s", dir)
			return
		}
		require.NoError(t, os.RemoveAll(dir))
	})

	cluster, err := pgcluster.Ensure(t.Context(), r.pgCfg)
	require.NoError(t, err)
	r.dbURL, r.port = cluster.URL("postgres"), cluster.Port()
	target := r.port
	if opts.pooler {
		// Its cleanup runs after the demos are killed, before the cluster
		// stops. It tries a restarted server again after a second, not 15.
		// 16 demos hold 80 client connections; the proxy's resets and stalls
		// add pgx's cancel requests (a connection each, up to 15 s) and
		// connections that the proxy has not closed yet: room for them.
		// Restarted when it exits by itself, as a supervisor would.
		r.bouncer = pgcluster.StartPgBouncerT(t, r.dbURL, &pgcluster.PgBouncerConfig{PoolSize: opts.poolSize, MaxClientConn: 200,
			Restart: true, Settings: map[string]string{"server_login_retry": "1"}})
		target = r.bouncer.Port()
	}
	// The proxy's cleanup runs after the demos are killed, before the cluster
	// stops.
	r.proxy = newFaultProxy(t, net.JoinHostPort("127.0.0.1", fmt.Sprint(target)))
	u, err := url.Parse(r.dbURL)
	require.NoError(t, err)
	u.Host = r.proxy.addr()
	r.demoURL = u.String()
	t.Cleanup(func() {
		for _, d := range r.started {
			d.kill()
			if log, err := os.ReadFile(d.cmd.Stderr.(*os.File).Name()); err == nil && bytes.Contains(log, []byte("WARNING: DATA RACE")) {
				t.Errorf("the demo (pid %d) reported a data race; see %s", d.cmd.Process.Pid, d.cmd.Stderr.(*os.File).Name())
			}
		}
	})
	t.Cleanup(r.workers.Wait) // the test's context is cancelled first: the workers return
	return r
}

// chaosStepFaults are the step faults that the demos inject, in turn.
var chaosStepFaults = []string{"", "DEMO_PANIC=provider:1", "DEMO_FAIL=finalize:12", "DEMO_PANIC=ledger:1"}

// spawn starts a demo on the run's database, through the proxy, as startDemo
// does, but with its output in files of the run's directory rather than in the
// test's log: a long run starts hundreds. It returns before the demo listens.
func (r *chaosRun) spawn() *demo {
	t := r.t
	bin, err := demoBinary()
	require.NoError(t, err)
	r.nDemos++
	name := filepath.Join(r.dir, fmt.Sprintf("demo-%03d", r.nDemos))
	stderr, err := os.Create(name + ".stderr")
	require.NoError(t, err)
	t.Cleanup(func() { _ = stderr.Close() })
	stdoutLog, err := os.Create(name + ".stdout")
	require.NoError(t, err)
	t.Cleanup(func() { _ = stdoutLog.Close() })

	args := append([]string{"-addr", "127.0.0.1:0", "-retry-backoff", "50ms", "-wait", "2s", "-lease", "1s",
		"-provider-timeout", "500ms", "-provider-settle", "4s"}, chaosEntryArgs...)
	if r.opts.pooler {
		args = append(args, "-pooler", "transaction")
	}
	cmd := exec.Command(bin, args...)
	// One sender of commits per demo: two operations that commit at once
	// share a commit (a group), so that groups meet the kills, restarts and
	// resets too, not only under a benchmark's load.
	cmd.Env = append(demoEnviron(), "DATABASE_URL="+r.demoURL, "DEMO_GROUP_SENDERS=1")
	// Every demo but one in four also injects step faults of its own, in every
	// operation it runs: panics before and at the provider call, and a finalize
	// that fails past the maximum attempts (10), after the provider refunded:
	// retried at the cap until it succeeds, never compensated.
	faults := chaosStepFaults[r.nDemos%len(chaosStepFaults)]
	if faults != "" {
		cmd.Env = append(cmd.Env, faults)
	}
	setDeathSignal(cmd)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	d := &demo{t: t, cmd: cmd, listening: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(stdoutLog, line+"\n")
			if _, u, ok := strings.Cut(line, listeningOn); ok {
				select {
				case d.listening <- strings.TrimSpace(u):
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		d.exitCode = cmd.ProcessState.ExitCode()
		close(d.exited)
	}()
	r.mu.Lock()
	r.started = append(r.started, d)
	r.stepFaults[faults]++
	r.mu.Unlock()
	return d
}

// setDemo puts d in slot i and offers it to the clients (nil takes slot i's away).
func (r *chaosRun) setDemo(i int, d *demo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.demos[i] = d
	r.bases = r.bases[:0]
	for _, d := range r.demos {
		if d != nil {
			r.bases = append(r.bases, d.base)
		}
	}
}

// base returns the base URL of a running demo, chosen with rng ("" when none).
func (r *chaosRun) base(rng *rand.Rand) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bases) == 0 {
		return ""
	}
	return r.bases[rng.IntN(len(r.bases))]
}

// broken records a broken invariant. dup counts it as something done twice,
// lost as something never done.
func (r *chaosRun) broken(dup, lost bool, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problem = append(r.problem, fmt.Sprintf(format, args...))
	if dup {
		r.dups++
	}
	if lost {
		r.lost++
	}
}

// start starts the demos (together: they migrate the empty database) and the
// client goroutines.
func (r *chaosRun) start() {
	ds := make([]*demo, len(r.demos))
	for i := range ds {
		ds[i] = r.spawn()
	}
	for i, d := range ds {
		d.waitListening()
		r.setDemo(i, d)
	}
	for w := range chaosWorkers {
		rng := rand.New(rand.NewPCG(r.seed, uint64(w)+1))
		r.workers.Go(func() { r.work(w, rng) })
	}
	r.workers.Go(r.redeliverWebhooks)
}

// inject injects faults for d, at random, then stops them and clears the
// provider's.
func (r *chaosRun) inject(d time.Duration) {
	t := r.t
	now := time.Now()
	r.faultsStart = now
	end := now.Add(d)
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.rng.Int64N(int64(hi-lo))) }
	nextKill := now.Add(between(500*time.Millisecond, 3*time.Second))
	nextFault := now.Add(between(200*time.Millisecond, 1500*time.Millisecond))
	nextRestart := now.Add(between(1500*time.Millisecond, max(2*time.Second, min(d/2, 5*time.Second))))
	nextSpike := now.Add(between(300*time.Millisecond, 3*time.Second))
	nextReset := now.Add(between(300*time.Millisecond, 3*time.Second))
	nextStall := now.Add(between(time.Second, max(2*time.Second, min(d/2, 5*time.Second))))
	r.workers.Go(func() { r.reconcileMidway(now.Add(d / 2)) })
	for {
		next := nextKill
		for _, at := range []time.Time{nextFault, nextRestart, nextSpike, nextReset, nextStall} {
			if at.Before(next) {
				next = at
			}
		}
		if next.After(end) {
			break
		}
		select {
		case <-time.After(time.Until(next)): // the schedule of the faults
		case <-r.ctx.Done():
			t.Fatal("the test ended during the chaos")
		}
		switch {
		case next.Equal(nextKill):
			r.kill()
			nextKill = time.Now().Add(between(500*time.Millisecond, 3*time.Second))
		case next.Equal(nextFault):
			r.fault()
			nextFault = time.Now().Add(between(200*time.Millisecond, 1500*time.Millisecond))
		case next.Equal(nextSpike):
			lasts := r.spikeLatency()
			nextSpike = time.Now().Add(lasts + between(500*time.Millisecond, 4*time.Second))
		case next.Equal(nextReset):
			r.resetConnections()
			nextReset = time.Now().Add(between(700*time.Millisecond, 3*time.Second))
		case next.Equal(nextStall):
			lasts := r.stallDatabase()
			nextStall = time.Now().Add(lasts + between(3*time.Second, 10*time.Second))
		default:
			r.restartDatabase()
			nextRestart = time.Now().Add(between(3*time.Second, 12*time.Second))
		}
		r.reviveExited()
	}
	select {
	case <-time.After(time.Until(end)):
	case <-r.ctx.Done():
		t.Fatal("the test ended during the chaos")
	}

	r.proxy.calm() // a spike or stall under way ends with the faults
	r.faultsEnd = time.Now()
	r.deadline.Store(r.faultsEnd.Add(chaosRecovery).UnixNano())
	r.stopping.Store(true)
	r.reviveExited()
	for {
		resp, err := r.send(r.ctx, r.base(r.rng), http.MethodDelete, "/provider/faults", "", "", nil, 10*time.Second)
		if err == nil && resp.status == http.StatusNoContent {
			break
		}
		require.False(t, r.pastDeadline(), "could not clear the provider's faults: %v %v", err, resp)
		time.Sleep(pollInterval)
	}
}

// kill kills one of the demos with SIGKILL and starts another at once.
func (r *chaosRun) kill() {
	i := r.rng.IntN(len(r.demos))
	d := r.demos[i]
	r.setDemo(i, nil)
	d.kill()
	r.kills.Add(1)
	r.event()
	d = r.spawn()
	d.waitListening()
	r.setDemo(i, d)
}

// reviveExited starts a demo again in the slot of one that exited by itself,
// which it must not: a demo outlives a database restart.
func (r *chaosRun) reviveExited() {
	for i, d := range r.demos {
		select {
		case <-d.exited:
		default:
			continue
		}
		r.exits.Add(1)
		r.broken(false, false, "demo pid %d exited by itself with status %d; see %s", d.cmd.Process.Pid, d.exitCode, d.cmd.Stderr.(*os.File).Name())
		r.setDemo(i, nil)
		d = r.spawn()
		d.waitListening()
		r.setDemo(i, d)
	}
}

// chaosFaults are the provider's fault modes that TestChaos injects.
var chaosFaults = []string{"error", "lost_response", "slow", "pending", "lagging_lookup", "lookup_error"}

// fault injects a provider fault for the next refund requests: one to three
// errors or lost responses, one to six slow answers, one to six pending
// refunds that succeed or fail later, one to three refunds made whose answer
// is lost and whose lookup lags behind (their event sent at once), or one to
// three lookups that cannot answer.
func (r *chaosRun) fault() {
	mode := chaosFaults[r.rng.IntN(len(chaosFaults))]
	count, delay := 1+r.rng.IntN(3), 0
	fault := map[string]any{"mode": mode}
	switch mode {
	case "slow":
		// Slow answers keep operations in flight when a process is killed;
		// some outlast the lease (renewed) and the client timeouts, and those
		// over -provider-timeout land after their call gave up.
		count, delay = 1+r.rng.IntN(6), 100+r.rng.IntN(1400)
	case "pending":
		count, delay = 1+r.rng.IntN(6), 100+r.rng.IntN(1400)
		fault["outcome"] = []string{"succeeded", "failed"}[r.rng.IntN(2)]
	case "lagging_lookup":
		delay = 100 + r.rng.IntN(1400)
	}
	fault["count"], fault["delayMs"] = count, delay
	body, err := json.Marshal(fault)
	require.NoError(r.t, err)
	resp, err := r.send(r.ctx, r.base(r.rng), http.MethodPost, "/provider/faults", "", "", body, 2*time.Second)
	if err != nil || resp.status != http.StatusNoContent {
		return // the database may be down: no fault this time
	}
	r.faultInjections.Add(1)
	r.faultRequests.Add(int64(count))
	r.mu.Lock()
	r.faults[mode]++
	r.mu.Unlock()
}

// restartDatabase stops PostgreSQL with a fast shutdown, which disconnects every
// client, leaves it down for up to a second, and starts it again on its port.
func (r *chaosRun) restartDatabase() {
	t := r.t
	stopped, err := pgcluster.Stop(r.ctx, r.pgCfg)
	require.NoError(t, err)
	require.True(t, stopped, "the cluster was not running")
	r.dbRestarts.Add(1)
	r.event()
	time.Sleep(time.Duration(r.rng.Int64N(int64(time.Second)))) // down for a while, as a real restart is
	cluster, err := pgcluster.Ensure(r.ctx, r.pgCfg)
	require.NoError(t, err)
	require.Equal(t, r.port, cluster.Port(), "the cluster came back on another port")
	if r.bouncer != nil {
		// Up for the demos once PgBouncer logs in again (it waits
		// server_login_retry after a failed login), as the cluster is for
		// them without it once Ensure returns.
		require.Eventually(t, func() bool {
			conn, err := pgx.Connect(r.ctx, r.bouncer.URL("postgres"))
			if err != nil {
				return false
			}
			defer func() { _ = conn.Close(context.WithoutCancel(r.ctx)) }()
			return conn.Ping(r.ctx) == nil
		}, 30*time.Second, 20*time.Millisecond, "PgBouncer did not reach the restarted cluster")
	}
}

// spikeLatency delays every byte between the demos and PostgreSQL, both ways,
// by 50 to 300 ms for the next 1 to 3 seconds, and returns how long.
func (r *chaosRun) spikeLatency() time.Duration {
	latency := 50*time.Millisecond + time.Duration(r.rng.Int64N(int64(250*time.Millisecond)))
	lasts := time.Second + time.Duration(r.rng.Int64N(int64(2*time.Second)))
	r.proxy.spike(latency, lasts)
	r.spikes.Add(1)
	return lasts
}

// resetConnections resets a random share of the connections between the demos
// and PostgreSQL (at least one), both sides, abruptly. The draws are the same
// however many connections there are, so that a seed replays the run's other
// choices too.
func (r *chaosRun) resetConnections() {
	share, seed := r.rng.Float64(), r.rng.Uint64()
	n := r.proxy.reset(share, seed)
	if n == 0 {
		return // none open: the database is restarting, say
	}
	r.resets.Add(1)
	r.resetConns.Add(int64(n))
	r.event()
}

// stallDatabase forwards nothing between the demos and PostgreSQL, either way,
// for the next 2 to 4 seconds, with every connection kept open, and returns how
// long.
func (r *chaosRun) stallDatabase() time.Duration {
	lasts := 2*time.Second + time.Duration(r.rng.Int64N(int64(2*time.Second)))
	r.proxy.stall(lasts)
	r.stalls.Add(1)
	r.event()
	return lasts
}

func (r *chaosRun) event() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, time.Now())
}

// send sends one request to base with a timeout and reads its answer.
func (r *chaosRun) send(ctx context.Context, base, method, path, token, key string, body []byte, timeout time.Duration) (*response, error) {
	if base == "" {
		return nil, errors.New("no demo is running")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

// work is a client goroutine: until the faults stop, it creates an order (one in
// seven a DECLINE- one) and refunds it under one to four keys at once, some of
// them more than is left, and now and then refunds an order that does not exist.
func (r *chaosRun) work(w int, rng *rand.Rand) {
	for n := 0; !r.stopping.Load() && r.ctx.Err() == nil; n++ {
		client := rng.IntN(len(chaosClients))
		if rng.IntN(chaosQueueOneIn) == 0 {
			r.queueOrder(w, n, client, rng)
			continue
		}
		o := &chaosKey{
			client: client, path: "/orders", key: newKey(),
			orderID:    fmt.Sprintf("C%d-%d", w, n),
			customerID: fmt.Sprintf("cus_%d", rng.IntN(4)),
			amount:     int64(1000 + rng.IntN(9000)),
		}
		if rng.IntN(7) == 0 {
			o.orderID = fakeprovider.DeclinePrefix + o.orderID
		}
		r.settle(o, rng)
		if o.final == nil || o.final.status != http.StatusCreated || r.stopping.Load() {
			continue
		}
		var refunds sync.WaitGroup
		for i := range 1 + rng.IntN(4) {
			k := &chaosKey{client: client, path: "/refunds", key: newKey(), orderID: o.orderID, amount: 1 + rng.Int64N(o.amount*2/3)}
			if rng.IntN(20) == 0 {
				k.orderID = fmt.Sprintf("NOPE-%d-%d-%d", w, n, i)
			}
			krng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			refunds.Go(func() { r.settle(k, krng) })
		}
		refunds.Wait()
	}
}

// engineFaultCodes are the codes of an operation that failed because of the
// engine itself (a step out of attempts...): a stored answer, but a fault.
var engineFaultCodes = []string{"attempts_exhausted", "compensation_failed", "result_failed", "unreadable_error", "unknown_error"}

// settle sends the key's request until it gets a final answer, as a client
// retries: to any running demo, with a short timeout, sometimes two or three
// copies at once, each with metadata of its own. Once the key is known to be
// taken, it may send a different amount under it (422), and once answered, the
// request again with other metadata (a byte-identical replay).
func (r *chaosRun) settle(k *chaosKey, rng *rand.Rand) {
	r.mu.Lock()
	r.keys = append(r.keys, k)
	r.mu.Unlock()
	token := chaosClients[k.client].token
	k.first = time.Now()
	reuse, replay := rng.IntN(5) == 0, rng.IntN(4) == 0
	for {
		if r.pastDeadline() {
			k.stuck = fmt.Sprintf("no final answer %s after the faults stopped", chaosRecovery)
			return
		}
		copies := 1
		if rng.IntN(4) == 0 {
			copies = 2 + rng.IntN(2)
			r.concurrent.Add(1)
		}
		answers := make([]*response, copies)
		errs := make([]error, copies)
		var wg sync.WaitGroup
		for i := range copies {
			body := k.body(randomMetadata(rng), 0)
			base := r.base(rng)
			timeout := 200*time.Millisecond + time.Duration(rng.Int64N(int64(2800*time.Millisecond)))
			wg.Go(func() {
				answers[i], errs[i] = r.send(r.ctx, base, http.MethodPost, k.path, token, k.key, body, timeout)
			})
		}
		wg.Wait()
		final := false
		for i := range copies {
			final = r.observe(k, answers[i], errs[i]) || final
		}
		if final {
			k.done = time.Now()
			break
		}
		if reuse && len(k.opIDs) > 0 {
			reuse = false
			r.checkReuse(k, rng)
		}
		time.Sleep(time.Duration(20+rng.IntN(80)) * time.Millisecond) // a client's pause before it retries
	}
	if reuse {
		r.checkReuse(k, rng)
	}
	if replay {
		r.checkReplay(k, rng)
	}
}

// randomMetadata returns metadata for one attempt: none, null, or an object.
func randomMetadata(rng *rand.Rand) any {
	switch rng.IntN(3) {
	case 0:
		return nil
	case 1:
		return map[string]any{"attempt": rng.IntN(1000)}
	default:
		return map[string]any{"note": newKey(), "nested": map[string]any{"n": rng.Float64()}}
	}
}

// observe records one answer to the key's request and reports whether it is
// final.
func (r *chaosRun) observe(k *chaosKey, resp *response, err error) bool {
	r.requests.Add(1)
	k.requests++
	if err != nil {
		k.interrupted = true
		if errors.Is(err, context.DeadlineExceeded) {
			r.timeouts.Add(1)
		} else {
			r.cut.Add(1)
		}
		return false
	}
	if id := resp.header.Get("Operation-Id"); id != "" && !slices.Contains(k.opIDs, id) {
		k.opIDs = append(k.opIDs, id)
		if len(k.opIDs) > 1 {
			r.broken(true, false, "%s names two operations: %v", k, k.opIDs)
		}
	}
	code := ""
	if resp.status >= 400 {
		var body struct {
			Error *apiError `json:"error"`
		}
		if json.Unmarshal(resp.body, &body) == nil && body.Error != nil {
			code = body.Error.Code
		}
	}
	switch {
	case resp.status == http.StatusAccepted:
		r.accepted.Add(1)
		return false
	case resp.status == http.StatusConflict && code == "request_in_progress":
		r.inProgress.Add(1)
		if resp.header.Get("Retry-After") == "" {
			r.broken(false, false, "%s: 409 without Retry-After", k)
		}
		return false
	case resp.status >= 500 && !slices.Contains(engineFaultCodes, code):
		// The database is down, or a demo is stopping: retry.
		k.interrupted = true
		r.serverErrors.Add(1)
		r.mu.Lock()
		r.fiveXX[fmt.Sprintf("%d %s", resp.status, code)]++
		r.mu.Unlock()
		return false
	}

	// A final answer: stored, so every final answer of the key is the same.
	if resp.header.Get("Idempotent-Replayed") != "true" {
		k.fresh++
		if k.fresh > 1 {
			r.broken(true, false, "%s: %d answers not marked as replays: its operation ran twice?", k, k.fresh)
		}
	}
	if k.final == nil {
		k.final = resp
	} else if resp.status != k.final.status || !bytes.Equal(resp.body, k.final.body) {
		r.broken(true, false, "%s: two final answers: %d %s and %d %s", k, k.final.status, k.final.body, resp.status, resp.body)
	}
	want := map[string][]string{
		"/orders": {"201"},
		// 402 provider_refund_failed: a pending refund that the provider failed.
		"/refunds": {"201", "422 amount_exceeds_refundable", "402 provider_refund_failed"},
	}[k.path]
	switch {
	case strings.HasPrefix(k.orderID, "NOPE-"):
		want = []string{"404 order_not_found"}
	case k.path == "/refunds" && strings.HasPrefix(k.orderID, fakeprovider.DeclinePrefix):
		want = []string{"402 provider_declined", "422 amount_exceeds_refundable"}
	}
	got := fmt.Sprint(resp.status)
	if code != "" {
		got += " " + code
	}
	if !slices.Contains(want, got) {
		r.broken(false, slices.Contains(engineFaultCodes, code), "%s: final answer %s, want one of %v: %s", k, got, want, resp.body)
	}
	return true
}

// checkReuse sends a different amount under the key, which is taken: 422
// idempotency_key_reused naming amount, whatever the state of its operation.
func (r *chaosRun) checkReuse(k *chaosKey, rng *rand.Rand) {
	r.reuseChecks.Add(1)
	for !r.pastDeadline() {
		resp, err := r.send(r.ctx, r.base(rng), http.MethodPost, k.path, chaosClients[k.client].token, k.key, k.body(nil, 1), 3*time.Second)
		r.requests.Add(1)
		if err != nil || resp.status >= 500 {
			time.Sleep(pollInterval)
			continue
		}
		var body struct {
			Error *apiError `json:"error"`
		}
		_ = json.Unmarshal(resp.body, &body)
		if resp.status != http.StatusUnprocessableEntity || body.Error == nil || body.Error.Code != "idempotency_key_reused" ||
			!slices.Equal(body.Error.MismatchedFields, []string{"amount"}) || !slices.Contains(k.opIDs, resp.header.Get("Operation-Id")) {
			r.broken(false, false, "%s with another amount: %d %s (operation %s), want 422 idempotency_key_reused [amount]",
				k, resp.status, resp.body, resp.header.Get("Operation-Id"))
		}
		return
	}
}

// checkReplay sends the request again with other metadata: the stored answer,
// byte for byte, marked as a replay.
func (r *chaosRun) checkReplay(k *chaosKey, rng *rand.Rand) {
	if k.final == nil {
		return
	}
	r.replayChecks.Add(1)
	for !r.pastDeadline() {
		resp, err := r.send(r.ctx, r.base(rng), http.MethodPost, k.path, chaosClients[k.client].token, k.key,
			k.body(map[string]any{"replay": true}, 0), 3*time.Second)
		r.requests.Add(1)
		if err != nil || resp.status >= 500 {
			time.Sleep(pollInterval)
			continue
		}
		if resp.status != k.final.status || !bytes.Equal(resp.body, k.final.body) || resp.header.Get("Idempotent-Replayed") != "true" {
			r.broken(true, false, "%s replayed with other metadata: %d %s (replayed %q), want %d %s",
				k, resp.status, resp.body, resp.header.Get("Idempotent-Replayed"), k.final.status, k.final.body)
		}
		return
	}
}

// pastDeadline reports whether the faults stopped more than chaosRecovery ago,
// or the test ended.
func (r *chaosRun) pastDeadline() bool {
	d := r.deadline.Load()
	return r.ctx.Err() != nil || d != 0 && time.Now().UnixNano() > d
}

// awaitFinalAnswers waits for the client goroutines, which return once every
// key they sent got its final answer or chaosRecovery passed, and fails listing
// the keys that got none.
func (r *chaosRun) awaitFinalAnswers() {
	r.workers.Wait()
	var stuck []string
	for _, k := range r.keys {
		if k.final == nil {
			stuck = append(stuck, fmt.Sprintf("%s: %s; operations %v; %d requests", k, k.stuck, k.opIDs, k.requests))
		}
	}
	if len(stuck) > 0 {
		r.mu.Lock()
		r.lost += len(stuck)
		r.mu.Unlock()
		r.report()
		r.t.Fatalf("%d keys got no final answer within %s after the faults stopped:\n%s", len(stuck), chaosRecovery, strings.Join(stuck, "\n"))
	}
}

// check checks the invariants once every key was answered, over HTTP and in the
// database.
func (r *chaosRun) check() {
	t := r.t
	clients := make([]*apiClient, len(chaosClients))
	for i, c := range chaosClients {
		clients[i] = &apiClient{t: t, base: r.base(r.rng), token: c.token}
	}

	// Refunds by order, and what each answer said.
	type orderBook struct {
		key       *chaosKey
		succeeded map[string]int64 // refund id -> amount
		declined  int
	}
	books := map[[2]string]*orderBook{} // (client, order id)
	var refunds []*chaosKey
	for _, k := range r.keys {
		if k.path != "/refunds" { // an order, by POST /orders or queued
			books[[2]string{chaosClients[k.client].name, k.orderID}] = &orderBook{key: k, succeeded: map[string]int64{}}
		} else {
			refunds = append(refunds, k)
		}
	}
	// A refund that the provider failed (pending, then failed) paid nothing:
	// only its succeeded refunds count.
	var providerRefunds []providerRefund
	failedAtProvider := map[string]bool{}
	for _, pr := range clients[0].providerRefunds() {
		switch pr.Status {
		case "succeeded":
			providerRefunds = append(providerRefunds, pr)
		case "failed":
			if failedAtProvider[pr.IdempotencyKey] {
				r.broken(true, false, "the provider made two refunds under the key %s", pr.IdempotencyKey)
			}
			failedAtProvider[pr.IdempotencyKey] = true
		default:
			r.broken(false, true, "the provider's refund %+v is not settled after the faults stopped", pr)
		}
	}
	byKey := map[string]providerRefund{}
	for _, pr := range providerRefunds {
		if _, dup := byKey[pr.IdempotencyKey]; dup {
			r.broken(true, false, "the provider made two refunds under the key %s", pr.IdempotencyKey)
		}
		byKey[pr.IdempotencyKey] = pr
	}
	derivedKeys := r.derivedKeys()
	succeeded := 0
	named := map[string]bool{} // the derived keys of the succeeded refunds
	for _, k := range refunds {
		derived := derivedKeys[[2]string{chaosClients[k.client].name, k.key}]
		pr, atProvider := byKey[derived]
		b := books[[2]string{chaosClients[k.client].name, k.orderID}]
		if b == nil { // an order that does not exist
			b = &orderBook{succeeded: map[string]int64{}}
		}
		switch k.final.status {
		case http.StatusCreated:
			succeeded++
			named[derived] = true
			var ref refundBody
			require.NoError(t, json.Unmarshal(k.final.body, &ref))
			switch {
			case !atProvider:
				r.broken(false, true, "%s: 201 %s, but the provider made no refund under %s", k, k.final.body, derived)
			case ref.ProviderRefundID == nil || pr.ID != *ref.ProviderRefundID || pr.Amount != k.amount || pr.OrderID != k.orderID:
				r.broken(false, false, "%s: 201 %s, but the provider's refund under its key is %+v", k, k.final.body, pr)
			}
			if ref.Status != "succeeded" || ref.Amount != k.amount || ref.OrderID != k.orderID || !strings.HasPrefix(ref.RefundID, "re_") {
				r.broken(false, false, "%s: 201 %s", k, k.final.body)
			}
			if _, dup := b.succeeded[ref.RefundID]; dup {
				r.broken(true, false, "%s: refund %s answered to two keys", k, ref.RefundID)
			}
			b.succeeded[ref.RefundID] = k.amount
		default:
			if atProvider {
				r.broken(true, false, "%s: %d %s, but the provider refunded %+v", k, k.final.status, k.final.body, pr)
			}
			if k.final.status == http.StatusPaymentRequired {
				b.declined++
			}
		}
	}
	for _, pr := range providerRefunds {
		if !named[pr.IdempotencyKey] {
			r.broken(true, false, "the provider refunded %+v, which no succeeded refund names", pr)
		}
	}
	if len(providerRefunds) != succeeded {
		r.broken(len(providerRefunds) > succeeded, len(providerRefunds) < succeeded,
			"the provider made %d refunds for %d succeeded refunds", len(providerRefunds), succeeded)
	}

	// Per order: its refunds are the succeeded ones answered and one failed per
	// decline; refunded is their sum, at most the order's amount.
	orderTotals := make([]int64, len(chaosClients))
	refundTotals := make([]int64, len(chaosClients))
	customers := make([]map[string]int64, len(chaosClients)) // customer -> expected balance
	for i := range customers {
		customers[i] = map[string]int64{}
	}
	for _, b := range books {
		k := b.key
		c := clients[k.client]
		o := c.getOrder(k.orderID)
		var sum int64
		failed := 0
		got := map[string]int64{}
		for _, ref := range o.Refunds {
			switch ref.Status {
			case "succeeded":
				sum += ref.Amount
				got[ref.RefundID] = ref.Amount
			case "failed":
				failed++
			default:
				r.broken(false, true, "order %s of %s: refund %s is %s", k.orderID, chaosClients[k.client].name, ref.RefundID, ref.Status)
			}
		}
		if o.Refunded != sum || sum > o.Amount || o.Amount != k.amount {
			r.broken(true, false, "order %s of %s: amount %d, refunded %d, succeeded refunds %d", k.orderID, chaosClients[k.client].name, o.Amount, o.Refunded, sum)
		}
		if len(got) != len(b.succeeded) || failed != b.declined {
			r.broken(len(got) > len(b.succeeded) || failed > b.declined, len(got) < len(b.succeeded) || failed < b.declined,
				"order %s of %s: %d succeeded and %d failed refunds, for %d 201s and %d 402s", k.orderID, chaosClients[k.client].name,
				len(got), failed, len(b.succeeded), b.declined)
		}
		for id, amount := range b.succeeded {
			if got[id] != amount {
				r.broken(false, true, "order %s of %s: refund %s answered 201 is not among its succeeded refunds", k.orderID, chaosClients[k.client].name, id)
			}
		}
		orderTotals[k.client] += k.amount
		refundTotals[k.client] += sum
		customers[k.client]["customer:"+k.customerID] += sum - k.amount
	}
	for i, c := range clients {
		accounts := c.accounts()
		var total int64
		paid := paidOut(accounts) // by settlements, from the merchant account
		for _, a := range accounts {
			total += a.Balance
			want, ok := customers[i][a.Account]
			switch {
			case a.Account == "merchant":
				if a.Balance+paid != orderTotals[i]-refundTotals[i] {
					r.broken(a.Balance+paid < orderTotals[i]-refundTotals[i], false, "%s: merchant balance %d and %d paid out, want orders %d - refunds %d",
						chaosClients[i].name, a.Balance, paid, orderTotals[i], refundTotals[i])
				}
			case strings.HasPrefix(a.Account, "payout:"):
			case !ok || a.Balance != want:
				r.broken(false, false, "%s: %s balance %d, want %d", chaosClients[i].name, a.Account, a.Balance, want)
			}
		}
		if total != 0 {
			r.broken(false, false, "%s: balances sum to %d: %+v", chaosClients[i].name, total, accounts)
		}
	}

	r.checkDatabase()
	r.checkEntryPoints()
	r.checkReconciliation()
}

// derivedKeys returns the derived key of the provider step of every refund, by
// (client, key), as the engine shows it: the keys are the operations' own.
func (r *chaosRun) derivedKeys() map[[2]string]string {
	t, ctx := r.t, r.ctx
	pool, err := pgxpool.New(ctx, r.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	wf, err := refund.New(&refund.ProviderClient{BaseURL: "http://127.0.0.1:1"}, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: wf.Operations()})
	require.NoError(t, err)
	keys := map[[2]string]string{}
	for _, k := range r.keys {
		if k.path != "/refunds" || len(k.opIDs) == 0 {
			continue
		}
		info, err := e.Get(ctx, uuid.MustParse(k.opIDs[0]))
		require.NoError(t, err)
		for _, st := range info.Steps {
			if st.Name == refund.StepProvider {
				keys[[2]string{info.Scope, info.Key}] = st.DerivedKey
			}
		}
	}
	return keys
}

// checkDatabase reads the database: one operation per key, none in progress, the
// state its answer said; each order's and refund's money moved once.
func (r *chaosRun) checkDatabase() {
	t := r.t
	ctx := r.ctx
	conn, err := pgx.Connect(ctx, r.dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))

	type opRow struct{ id, state string }
	ops := map[[2]string]opRow{}
	// The clients' operations, under their keys and their message ids; not
	// those of the provider's webhooks or of settlements (checkEntryPoints).
	var scopes []string
	for _, c := range chaosClients {
		scopes = append(scopes, c.name, "queue:"+c.name)
	}
	rows, err := conn.Query(ctx, "SELECT scope, key, id::text, state FROM idemflow_operation WHERE scope = ANY($1) AND name <> 'settlement'", scopes)
	require.NoError(t, err)
	for rows.Next() {
		var scope, key string
		var op opRow
		require.NoError(t, rows.Scan(&scope, &key, &op.id, &op.state))
		ops[[2]string{scope, key}] = op
	}
	require.NoError(t, rows.Err())
	inProgress := 0
	for _, op := range ops {
		if op.state == "in_progress" {
			inProgress++
		}
	}
	if inProgress > 0 {
		r.broken(false, true, "%d operations are still in progress", inProgress)
	}
	if len(ops) != len(r.keys) {
		r.broken(len(ops) > len(r.keys), len(ops) < len(r.keys), "%d operations for %d keys", len(ops), len(r.keys))
	}
	for _, k := range r.keys {
		op, ok := ops[[2]string{k.scope(), k.key}]
		want := "failed"
		if k.final.status == http.StatusCreated {
			want = "succeeded"
		}
		switch {
		case !ok:
			r.broken(false, true, "%s: no operation", k)
		case len(k.opIDs) != 1 || op.id != k.opIDs[0] || op.state != want:
			r.broken(false, false, "%s: operation %s %s, answered %v %d", k, op.id, op.state, k.opIDs, k.final.status)
		}
	}

	// Money moves: one per order; one per refund, and one back per declined one.
	var badOrders, badRefunds, pending int
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT count(*) FROM (
			SELECT o.client, o.order_id FROM demo_order o
			LEFT JOIN demo_ledger_entry e ON e.client = o.client AND e.order_id = o.order_id AND e.kind = 'order'
			GROUP BY o.client, o.order_id HAVING count(DISTINCT e.move_id) <> 1
		) bad`).Scan(&badOrders))
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT count(*) FROM (
			SELECT r.id FROM demo_refund r
			LEFT JOIN demo_ledger_entry e ON e.refund_id = r.id
			GROUP BY r.id, r.status
			HAVING count(DISTINCT e.move_id) FILTER (WHERE e.kind = 'refund') <> 1
			    OR count(DISTINCT e.move_id) FILTER (WHERE e.kind = 'refund_reversal') <> CASE r.status WHEN 'failed' THEN 1 ELSE 0 END
		) bad`).Scan(&badRefunds))
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM demo_refund WHERE status = 'pending'").Scan(&pending))
	if badOrders > 0 || badRefunds > 0 {
		r.broken(true, false, "%d orders and %d refunds did not move money exactly once", badOrders, badRefunds)
	}
	if pending > 0 {
		r.broken(false, true, "%d refunds are still pending", pending)
	}
}

// chaosReconcile is what a reconciliation run of TestChaos found.
type chaosReconcile struct {
	answered bool
	requests int // the POSTs it took (a demo killed, the database down)
	// inProgress counts the operations in progress as the run that answered
	// was asked for, halfway; -1 when the database did not say.
	inProgress int64
	checked    int64
	mismatches []mismatch
}

// reconcileMidway asks the demos for a reconciliation run at the time at,
// halfway through the faults, with the clients' operations in flight, and
// again until one answers: it must find no mismatch (a pending refund, or one
// whose operation is in progress, is not judged).
func (r *chaosRun) reconcileMidway(at time.Time) {
	select {
	case <-time.After(time.Until(at)):
	case <-r.ctx.Done():
		return
	}
	rng := rand.New(rand.NewPCG(r.seed, 0x7ec))
	rc := chaosReconcile{inProgress: -1}
	for !r.pastDeadline() {
		rc.requests++
		inProgress, err := r.countInProgress()
		if err != nil {
			inProgress = -1
		}
		// The body, {}, is not read.
		resp, err := r.send(r.ctx, r.base(rng), http.MethodPost, "/admin/reconciliation/run", adminToken, "", []byte("{}"), 10*time.Second)
		var rep reconciliationReport
		if err != nil || resp.status != http.StatusOK || json.Unmarshal(resp.body, &rep) != nil {
			time.Sleep(pollInterval) // a demo killed, the database down: again
			continue
		}
		rc.answered, rc.inProgress, rc.checked, rc.mismatches = true, inProgress, rep.Checked, rep.Mismatches
		break
	}
	for _, m := range rc.mismatches {
		r.broken(false, false, "reconciliation halfway through the faults: a false mismatch %+v", m)
	}
	r.mu.Lock()
	r.midReconcile = rc
	r.mu.Unlock()
}

// countInProgress counts the operations in progress, reading the cluster
// directly (not through the proxy), within a second.
func (r *chaosRun) countInProgress() (int64, error) {
	ctx, cancel := context.WithTimeout(r.ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var n int64
	err = conn.QueryRow(ctx, "SELECT count(*) FROM idemflow_operation WHERE state = 'in_progress'").Scan(&n)
	return n, err
}

// checkReconciliation runs a reconciliation once every key was answered: it
// must read every refund the provider made and find no mismatch, and the
// gauge of the demo that ran it must show none.
func (r *chaosRun) checkReconciliation() {
	t := r.t
	d := r.demos[0]
	all := (&apiClient{t: t, base: d.base}).providerRefunds()
	var resp *response
	var rc chaosReconcile
	eventually(t, func() bool {
		rc.requests++
		var err error
		resp, err = r.send(r.ctx, d.base, http.MethodPost, "/admin/reconciliation/run", adminToken, "", []byte("{}"), 30*time.Second)
		return err == nil && resp.status == http.StatusOK
	}, "a reconciliation run answers once the faults stopped")
	rep := readReconciliation(t, resp)
	rc.answered, rc.checked, rc.mismatches = true, rep.Checked, rep.Mismatches
	if rep.Checked != int64(len(all)) {
		r.broken(false, true, "reconciliation read %d records; the provider made %d refunds", rep.Checked, len(all))
	}
	for _, m := range rep.Mismatches {
		r.broken(false, false, "reconciliation at the end: a false mismatch %+v", m)
	}
	metrics := metricsOf(t, d)
	for _, kind := range mismatchKinds {
		if n := metrics[`idemflow_reconciliation_mismatches{kind="`+kind+`"}`]; n != 0 {
			r.broken(false, false, "the gauge shows %v mismatches %s", n, kind)
		}
	}
	r.mu.Lock()
	r.endReconcile = rc
	r.mu.Unlock()
}

// reconcileReport is the report's line on reconciliation; the caller holds
// r.mu.
func (r *chaosRun) reconcileReport() string {
	mid, end := r.midReconcile, r.endReconcile
	halfway := fmt.Sprintf("halfway: no run answered in %d requests", mid.requests)
	if mid.answered {
		halfway = fmt.Sprintf("%d false mismatches with operations in flight (halfway, %d in progress, %d records checked, %d requests)",
			len(mid.mismatches), mid.inProgress, mid.checked, mid.requests)
	}
	atEnd := "none run at the end"
	if end.answered {
		atEnd = fmt.Sprintf("%d at the end (%d records checked)", len(end.mismatches), end.checked)
	}
	return fmt.Sprintf("  reconciliation:     %s; %s", halfway, atEnd)
}

// report logs and prints what the run did, and fails the test on any broken
// invariant.
func (r *chaosRun) report() {
	groups := r.groupCommits()
	r.mu.Lock()
	defer r.mu.Unlock()
	var orders, refunds, succeeded, declined, exceeded, notFound, interrupted, retries int
	var longest, longestAfterEvent time.Duration
	var longestKey, longestEventKey *chaosKey
	for _, k := range r.keys {
		if k.path != "/refunds" {
			orders++
		} else {
			refunds++
		}
		retries += k.requests - 1
		if k.final == nil {
			continue
		}
		switch {
		case k.path != "/refunds":
		case k.final.status == http.StatusCreated:
			succeeded++
		case k.final.status == http.StatusPaymentRequired:
			declined++
		case k.final.status == http.StatusNotFound:
			notFound++
		default:
			exceeded++
		}
		if k.interrupted {
			interrupted++
		}
		if d := k.done.Sub(k.first); d > longest {
			longest, longestKey = d, k
		}
		// The first kill, restart, reset or stall during the key's life, to
		// its final answer.
		for _, e := range r.events {
			if e.After(k.first) && e.Before(k.done) {
				if d := k.done.Sub(e); d > longestAfterEvent {
					longestAfterEvent, longestEventKey = d, k
				}
				break
			}
		}
	}
	describe := func(k *chaosKey) string {
		if k == nil {
			return "none"
		}
		return fmt.Sprintf("%s, %d requests", k.kind()+" key "+k.key, k.requests)
	}
	requests := r.requests.Load()
	lines := []string{
		fmt.Sprintf("chaos report: seed %d, %s of faults against %d demo processes (-lease 1s -retry-backoff 50ms -wait 2s -provider-timeout 500ms -provider-settle 4s%s), %d client goroutines",
			r.seed, r.faultsEnd.Sub(r.faultsStart).Round(time.Second), len(r.demos), r.poolerNote(), chaosWorkers),
		fmt.Sprintf("  operations:         %d keys: %d orders, %d refunds (%d succeeded, %d declined 402, %d exceeded 422, %d order not found 404)",
			len(r.keys), orders, refunds, succeeded, declined, exceeded, notFound),
		fmt.Sprintf("  requests:           %d; retries of a key: %d, after %d cut by a kill or restart, %d client timeouts, %d 5xx (%s), %d 202, %d 409 in progress",
			requests, retries, r.cut.Load(), r.timeouts.Load(), r.serverErrors.Load(), countsByName(r.fiveXX), r.accepted.Load(), r.inProgress.Load()),
		fmt.Sprintf("  resends:            %d rounds of 2-3 concurrent copies; %d different-amount checks (422), %d metadata-only replays",
			r.concurrent.Load(), r.reuseChecks.Load(), r.replayChecks.Load()),
		fmt.Sprintf("  kills:              %d (SIGKILL, restarted at once); %d demos exited by themselves", r.kills.Load(), r.exits.Load()),
		fmt.Sprintf("  provider faults:    %d injections (error %d, lost_response %d, slow %d, pending %d, lagging_lookup %d, lookup_error %d) for up to %d refund requests or lookups",
			r.faultInjections.Load(), r.faults["error"], r.faults["lost_response"], r.faults["slow"], r.faults["pending"],
			r.faults["lagging_lookup"], r.faults["lookup_error"], r.faultRequests.Load()),
		fmt.Sprintf("  database restarts:  %d (fast shutdown, down up to 1s, start)", r.dbRestarts.Load()),
		fmt.Sprintf("  database proxy:     %d latency spikes, %d resets (%d connections), %d stalls",
			r.spikes.Load(), r.resets.Load(), r.resetConns.Load(), r.stalls.Load()),
		fmt.Sprintf("  step faults:        demos started with none %d, %s %d, %s %d, %s %d", r.stepFaults[""],
			chaosStepFaults[1], r.stepFaults[chaosStepFaults[1]], chaosStepFaults[2], r.stepFaults[chaosStepFaults[2]],
			chaosStepFaults[3], r.stepFaults[chaosStepFaults[3]]),
		r.entryReport(),
		r.reconcileReport(),
		groups,
		fmt.Sprintf("  duplicates found:   %d", r.dups),
		fmt.Sprintf("  operations lost:    %d", r.lost),
		fmt.Sprintf("  longest recovery:   %s from the first request to the final answer (%s); %s from a kill, restart, reset or stall to the final answer of a key it interrupted (%s); %d keys interrupted",
			longest.Round(time.Millisecond), describe(longestKey), longestAfterEvent.Round(time.Millisecond), describe(longestEventKey), interrupted),
	}
	report := strings.Join(lines, "\n")
	r.t.Log("\n" + report)
	fmt.Println(report)
	if len(r.problem) > 0 {
		shown := r.problem[:min(len(r.problem), 50)]
		r.t.Errorf("%d broken invariants (%d duplicates, %d lost), the first %d:\n%s", len(r.problem), r.dups, r.lost, len(shown), strings.Join(shown, "\n"))
	}
}

// poolerNote describes the run's PgBouncer for its report, if it has one.
func (r *chaosRun) poolerNote() string {
	if !r.opts.pooler {
		return ""
	}
	return fmt.Sprintf(" -pooler transaction, through PgBouncer with %d server connections, which exited by itself and was restarted %d times",
		r.opts.poolSize, r.bouncer.Restarts())
}

// stop stops the demos with SIGTERM, all at once: they exit 0.
func (r *chaosRun) stop() {
	for _, d := range r.demos {
		require.NoError(r.t, d.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, d := range r.demos {
		require.Equal(r.t, 0, d.waitExit(), "exit status of demo pid %d after SIGTERM", d.cmd.Process.Pid)
	}
}

// countsByName writes counts as "name n, name n", in name order; "none" when empty.
func countsByName(counts map[string]int) string {
	if len(counts) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(counts))
	for _, name := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", name, counts[name]))
	}
	return strings.Join(parts, ", ")
}

// groupCommits reads, from the metrics of the demos running now, the groups
// of commits they sent (idemflow_commit_group_size) since they started, for
// the report.
func (r *chaosRun) groupCommits() string {
	r.mu.Lock()
	demos := slices.Clone(r.demos)
	r.mu.Unlock()
	var groups, members, split float64
	running := 0
	for _, d := range demos {
		if d == nil {
			continue
		}
		m, err := scrapeMetrics(d.base)
		if err != nil {
			continue
		}
		running++
		for _, s := range []string{"false", "true"} {
			groups += m[`idemflow_commit_group_size_count{split="`+s+`"}`]
			members += m[`idemflow_commit_group_size_sum{split="`+s+`"}`]
		}
		split += m[`idemflow_commit_group_size_count{split="true"}`]
	}
	return fmt.Sprintf("  group commits:      %.0f groups of %.0f transactions, %.0f split, in the %d demos running at the end (DEMO_GROUP_SENDERS=1)",
		groups, members, split, running)
}
