package idemflowtest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/faults"
)

// Matrix runs a user's operation through every crash point, or every fault of
// its external steps, and checks the user's invariants after each.
//
// Everything the operation needs is made in Setup and Operation, never before
// Crashes or Faults is called: the crash matrix re-executes the test binary to
// run the test again in a child process, which must build the same operation.
type Matrix[In, S, Out any] struct {
	// Setup prepares one run, in the test process, on the run's own database:
	// the rows the operation needs, and the fakes of the outside services it
	// calls, which must outlive a killed child (start them with t's cleanup).
	// It returns the run's environment and check.
	Setup func(t *testing.T, pool *pgxpool.Pool) *Run
	// Operation builds the operation from the run's database and Env, in the
	// test process and in the child.
	Operation func(pool *pgxpool.Pool, env map[string]string) (*engine.Operation[In, S, Out], error)
	// Input is the operation's input.
	Input In
	// InputFunc, when not nil, makes the operation's input from the run's
	// Env in place of Input, in the test process and in the child alike
	// (which get the same Env): an input that depends on the run, such as a
	// release date a moment after Setup. It must make the same input from the
	// same Env, or the client's retry after a crash is refused as another
	// request under the key.
	InputFunc func(env map[string]string) In
	// WaitFunc satisfies the operation's waits, in every process that runs it
	// (see WaitFunc). Nil is SatisfyWait: approvals are given, timers pass by
	// themselves, and a signal step fails the run.
	WaitFunc WaitFunc
	// Config, when not nil, is the base of the engines' configuration; its
	// Operations and Test.Hook are the matrix's, its Observer is kept.
	Config *engine.Config
}

// input is the operation's input in a run with env.
func (m Matrix[In, S, Out]) input(env map[string]string) In {
	if m.InputFunc != nil {
		return m.InputFunc(env)
	}
	return m.Input
}

// Run is one run of a matrix: what the child needs to know, and the check.
type Run struct {
	// Env is handed to Operation, in the child too: an outside service's URL,
	// an account's id.
	Env map[string]string
	// Check says whether the books are right once the operation has finished
	// or been parked (info has its steps): nil, or an error that names the
	// broken invariant ("2 bank payouts for one key"). It sees every outcome
	// the faults lead to: a declined call fails the operation, and the books
	// must say so too.
	Check func(ctx context.Context, info *engine.Info) error
	// Services are the outside services the operation calls over HTTP, by the
	// name in Env of their base URL. The kit puts in Env, in its place, the URL
	// of a proxy of its own that injects the faults (see Service): the
	// operation's own client, decoding and lookup meet each one. Without
	// Services, the fault matrix injects at the engine instead (see Fault),
	// where the operation's decoding of an answer never runs. With them,
	// every external step's calls must reach one: a fault that no call of its
	// step met is reported as not injected.
	Services map[string]Service
}

// Result is the outcome of one point of a matrix.
type Result struct {
	// Point is "<step>/<point>" ("debit/after-effect") for a crash, and
	// "<step>/<fault>" ("bank/lost-response") for a fault; "baseline" for the
	// run with neither.
	Point string
	// Status and Parked are the operation's after the resume.
	Status engine.Status
	Parked bool
	// Found is true when the client's retry after the crash found the
	// operation (its reservation had committed), false when it started anew.
	Found bool
	// Err is the broken invariant, or what kept the run from finishing; nil
	// when the books were right.
	Err error
}

// Fault names a failure, or an outcome, of an external step's call.
//
// With Run.Services, each is injected by the kit's proxy, on the way between
// the operation's client and the service, on the step's first call: the
// operation reads a dropped connection, a timeout of its own client, or the
// service's own words for a decline or a pending call (Service), and decodes
// them itself. Without, the fault matrix injects the first five at the engine
// (engine.Config.Faults) as before: the step's function, or its lookup, is made
// to return an error it never wrote, so the operation's reading of the
// service's answers goes untested; FaultDeclined and FaultPendingFailed need
// Services.
type Fault string

// The faults of the fault matrix, each on one external step.
const (
	// FaultError: the step's first call fails before it reaches the service
	// (its connection is dropped).
	FaultError Fault = "error"
	// FaultLostResponse: the first call takes effect and its answer is lost
	// (the connection is dropped).
	FaultLostResponse Fault = "lost-response"
	// FaultTimeout: the first call takes effect and its answer is held back
	// until the client's own timeout.
	FaultTimeout Fault = "timeout"
	// FaultLateLanding: the first call is held until the client's timeout,
	// not carried out, and lands at the service just inside the step's settle
	// window (a quarter of the window, at most 250ms, before the settleBy the
	// database fixed; at most 10 seconds after the call gave up): the step's
	// lookup finds nothing until then, and must find it after. Its later
	// attempts are refused before they are sent (engine.Permanent), so that
	// only the lookup decides. A window shorter than the call's timeout fails
	// the point whatever the books say: a service may take as long to carry
	// out a request as the step waits for its answer. (Without Services, the
	// call lands LateLanding after it and no timeout is known.)
	FaultLateLanding Fault = "late-landing"
	// FaultPending: the first call takes effect and is answered "pending" in
	// the service's words; its lookup answers "pending" until PendingFor has
	// passed and it said so once, then the service's own answer: pending
	// then succeeded. (Without Services: engine.Accepted, at the engine.)
	FaultPending Fault = "pending"
	// FaultPendingFailed: the first call is answered "pending" and takes no
	// effect; the lookup answers "pending", then the service's failure
	// (Service.LookupFailed). Needs Services.
	FaultPendingFailed Fault = "pending-failed"
	// FaultDeclined: every call under the step's key is declined in the
	// service's words (Service.Declined) and takes no effect. Needs Services.
	FaultDeclined Fault = "declined"
)

// How late FaultLateLanding lands when the faults are injected at the engine
// (without Run.Services), and how long FaultPending stays pending.
const (
	LateLanding = 300 * time.Millisecond
	PendingFor  = 300 * time.Millisecond
)

// Faults lists every Fault, in the order the fault matrix tries them.
var Faults = []Fault{FaultError, FaultLostResponse, FaultTimeout, FaultLateLanding, FaultPending, FaultPendingFailed, FaultDeclined}

// engineFaults are the faults injected at the engine, without Run.Services.
var engineFaults = []Fault{FaultError, FaultLostResponse, FaultTimeout, FaultLateLanding, FaultPending}

// The crash points after an answer that is no success, with Run.Services:
// the service declined the step's first call, or answered it pending, and the
// process dies with the answer read, before its checkpoint commits.
const (
	pointAfterDeclined Point = "after-declined"
	pointAfterPending  Point = "after-pending"
)

// pointWaiting is the crash point of a wait step that the first run saw
// waiting (for a signal, approvals or a moment): the process is killed
// there, with no process busy on the operation, and the wait is carried out
// by the process that takes it over (after the moment, for a timer).
const pointWaiting Point = "waiting"

// The child's environment.
const (
	envChild = "IDEMFLOWTEST_CRASH_CHILD"
	envURL   = "IDEMFLOWTEST_CRASH_URL"
	envPoint = "IDEMFLOWTEST_CRASH_POINT"
	envEnv   = "IDEMFLOWTEST_CRASH_ENV"

	markReached    = "IDEMFLOWTEST CRASH POINT REACHED"
	markNotReached = "IDEMFLOWTEST CRASH POINT NOT REACHED"

	scope = "idemflowtest"
	key   = "matrix"

	childTimeout = 60 * time.Second
	waitTimeout  = 30 * time.Second
)

// Crashes runs the operation once without a crash, to learn its points, then
// once per point (each step before it runs and after its effect, each
// compensation before and after it, as that first run reached them; with
// Run.Services, each external step after its first call was answered declined,
// and after it was answered pending, as the Service words them; each wait
// step while the operation waits there, see below) in a child process killed
// with SIGKILL there. The operation then resumes in a fresh engine, as a
// client's retry of the same key finds it, and the check runs. Each point is
// a subtest of its own, which fails naming the broken invariant; a table of
// every point is logged at the end.
//
// The child and the fresh engine both drive the operation past its waits
// with WaitFunc. A wait step's points are where the engine decides its wait:
// "<step>/before" a signal (or a deadline's function) is applied, a signal
// accepted and not applied; "<step>/after-effect" once it is applied, or an
// approval or a timer decided, its checkpoint not committed; and
// "<step>/waiting", the process killed while the operation waits there, its
// WaitFunc not called yet (for a timer, the fresh engine starts after the
// moment, which then passes while no process is up). At each of them the
// resumed process must decide the wait exactly once
// (engine.Observer.Waited), besides keeping the books right.
func (m Matrix[In, S, Out]) Crashes(t *testing.T) {
	t.Helper()
	m.report(t, m.crashResults(t, true), true)
}

// CrashResults is Crashes without failing t for a broken invariant: it returns
// every point's result, for a test that expects the matrix to find something.
func (m Matrix[In, S, Out]) CrashResults(t *testing.T) []Result {
	t.Helper()
	return m.crashResults(t, false)
}

func (m Matrix[In, S, Out]) crashResults(t *testing.T, fail bool) []Result {
	t.Helper()
	if c := os.Getenv(envChild); c != "" {
		// A child: run only the point it was started for, under the same
		// subtest names as its parent, so that -test.run finds it.
		if strings.HasPrefix(c, t.Name()+"/") {
			var p point
			if err := json.Unmarshal([]byte(os.Getenv(envPoint)), &p); err != nil {
				t.Fatalf("idemflowtest child: point: %v", err)
			}
			t.Run("crash", func(t *testing.T) {
				t.Run(p.name(), func(t *testing.T) {
					if t.Name() == c {
						m.child(t, p)
					}
				})
			})
		}
		return nil
	}
	base, points, svcs := m.baseline(t)
	var outcomes []point
	for _, p := range points {
		if p.Kind != engine.StepKindExternal || p.Point != faults.PointBefore {
			continue
		}
		if words(svcs, FaultDeclined) {
			outcomes = append(outcomes, point{Step: p.Step, Point: pointAfterDeclined, Kind: p.Kind})
		}
		if words(svcs, FaultPending) {
			outcomes = append(outcomes, point{Step: p.Step, Point: pointAfterPending, Kind: p.Kind})
		}
	}
	points = append(points, outcomes...)
	names := make([]string, len(points))
	for i, p := range points {
		names[i] = p.name()
	}
	return append([]Result{base}, runPoints(t, "crash", names, fail, func(t *testing.T, i int) Result {
		return m.crashAt(t, points[i])
	})...)
}

// Faults runs the operation once without a fault, to learn its external steps,
// then once per external step and Fault, in this process, and runs the check
// after each. Each is a subtest of its own. With Run.Services the faults are
// injected at the services' proxies, each that the Services can word (see
// Fault); without, at the engine.
func (m Matrix[In, S, Out]) Faults(t *testing.T) {
	t.Helper()
	m.report(t, m.faultResults(t, true), true)
}

// FaultResults is Faults without failing t for a broken invariant.
func (m Matrix[In, S, Out]) FaultResults(t *testing.T) []Result {
	t.Helper()
	return m.faultResults(t, false)
}

func (m Matrix[In, S, Out]) faultResults(t *testing.T, fail bool) []Result {
	t.Helper()
	if os.Getenv(envChild) != "" {
		return nil // a crash matrix's child runs only its own point
	}
	base, points, svcs := m.baseline(t)
	list := engineFaults
	if len(svcs) > 0 {
		list = nil
		for _, f := range Faults {
			if words(svcs, f) {
				list = append(list, f)
			}
		}
	}
	var external []string
	for _, p := range points {
		if p.Kind == engine.StepKindExternal && p.Point == faults.PointBefore {
			external = append(external, p.Step)
		}
	}
	type faultPoint struct {
		step  string
		fault Fault
	}
	var faults []faultPoint
	for _, s := range external {
		for _, f := range list {
			faults = append(faults, faultPoint{s, f})
		}
	}
	names := make([]string, len(faults))
	for i, fp := range faults {
		names[i] = fp.step + "/" + string(fp.fault)
	}
	return append([]Result{base}, runPoints(t, "fault", names, fail, func(t *testing.T, i int) Result {
		return m.withFault(t, faults[i].step, faults[i].fault)
	})...)
}

// runPoints runs run for each of names, as parallel subtests of a subtest
// named group, and returns their results in the order of names. With fail, a
// point whose invariants broke fails its subtest.
func runPoints(t *testing.T, group string, names []string, fail bool, run func(t *testing.T, i int) Result) []Result {
	t.Helper()
	results := make([]Result, len(names))
	t.Run(group, func(t *testing.T) {
		for i, name := range names {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := run(t, i)
				r.Point = name
				if fail && r.Err != nil {
					t.Errorf("%s broke an invariant: %v", name, r.Err)
				}
				results[i] = r
			})
		}
	})
	return results
}

// point is a moment at which the first run was seen.
type point struct {
	Step  string          `json:"step"`
	Point Point           `json:"point"`
	Kind  engine.StepKind `json:"kind,omitempty"`
	// Wait and Deadline, for pointWaiting, are what the step waited for, and
	// whether its wait had an end fixed (a moment, a deadline, an expiry).
	Wait     engine.WaitReason `json:"wait,omitempty"`
	Deadline bool              `json:"deadline,omitempty"`
}

func (p point) name() string { return p.Step + "/" + string(p.Point) }

// words reports whether one of svcs words what f needs.
func words(svcs map[string]Service, f Fault) bool {
	for _, s := range svcs {
		switch f {
		case FaultDeclined:
			if s.Declined != nil {
				return true
			}
		case FaultPending:
			if s.Pending != nil && s.LookupPending != nil {
				return true
			}
		case FaultPendingFailed:
			if s.Pending != nil && s.LookupPending != nil && s.LookupFailed != nil {
				return true
			}
		default:
			return true
		}
	}
	return false
}

// baseline runs the operation with neither crash nor fault, recording the
// points it reaches in order, and checks the books. It returns the run's
// Services too.
func (m Matrix[In, S, Out]) baseline(t *testing.T) (Result, []point, map[string]Service) {
	t.Helper()
	var mu sync.Mutex
	seen := map[point]bool{}
	var points []point
	hook := func(_ context.Context, ev faults.Event) error {
		mu.Lock()
		defer mu.Unlock()
		p := point{Step: ev.Step, Point: ev.Point}
		if !seen[p] {
			seen[p] = true
			points = append(points, p)
		}
		return nil
	}
	// The steps seen waiting, at the moment they were.
	seenWaiting := func(_ *engine.Info, s engine.StepInfo) bool {
		mu.Lock()
		defer mu.Unlock()
		points = append(points, point{Step: s.Name, Point: pointWaiting, Wait: s.Wait.Reason, Deadline: s.Wait.Until != nil})
		return true
	}
	var res Result
	var svcs map[string]Service
	t.Run("baseline", func(t *testing.T) {
		_, pool, run := m.prepare(t, newPlan(t, "", ""))
		svcs = run.Services
		e, op := m.engine(t, pool, run, hook, true)
		w := m.waiter(e)
		w.seen = seenWaiting
		res = m.finishWith(t, e, op, run, w, "baseline")
		if res.Err != nil {
			t.Errorf("without a crash or fault: %v", res.Err)
		}
		// The kind of each step, for the fault matrix.
		info, err := e.GetByKey(t.Context(), scope, key)
		if err != nil {
			t.Fatalf("idemflowtest: read the baseline operation: %v", err)
		}
		kinds := map[string]engine.StepKind{}
		for _, s := range info.Steps {
			kinds[s.Name] = s.Kind
		}
		mu.Lock()
		for i := range points {
			points[i].Kind = kinds[points[i].Step]
		}
		mu.Unlock()
	})
	if t.Failed() {
		t.FailNow()
	}
	return res, points, svcs
}

// newPlan returns the plan of a run of t with fault on step ("" for none).
func newPlan(t *testing.T, step string, fault Fault) *plan {
	return &plan{ctx: t.Context(), step: step, fault: fault}
}

// prepare makes a run's database and runs Setup on it. With Run.Services, it
// serves a proxy for each, which injects pl's fault, and returns the Run with
// their URLs in Env.
func (m Matrix[In, S, Out]) prepare(t *testing.T, pl *plan) (string, *pgxpool.Pool, *Run) {
	t.Helper()
	url := DatabaseURL(t)
	pool := openPool(t, url, nil)
	run := m.Setup(t, pool)
	if run == nil || run.Check == nil {
		t.Fatal("idemflowtest: Setup returned no Run with a Check")
	}
	if len(run.Services) > 0 {
		env := maps.Clone(run.Env)
		for name, svc := range run.Services {
			env[name] = startProxy(t, name, run.Env[name], svc, pl)
		}
		run = &Run{Env: env, Check: run.Check, Services: run.Services}
	}
	return url, pool, run
}

// engine makes the operation and an engine for it with hook.
func (m Matrix[In, S, Out]) engine(t *testing.T, pool *pgxpool.Pool, run *Run, hook faults.Hook, workers bool) (*engine.Engine, *engine.Operation[In, S, Out]) {
	t.Helper()
	return m.engineWith(t, pool, run, hook, nil, nil, workers)
}

// config is the base of the matrix's engines' configuration: Config, or the
// kit's quiet logger.
func (m Matrix[In, S, Out]) config() engine.Config {
	cfg := engine.Config{}
	if m.Config != nil {
		cfg = *m.Config
	}
	if cfg.Logger == nil {
		cfg.Logger = logger()
	}
	return cfg
}

// engineWith is engine with a lookup hook (faults.Config.Lookup) and an
// observer (beside Config's) too.
func (m Matrix[In, S, Out]) engineWith(t *testing.T, pool *pgxpool.Pool, run *Run, hook faults.Hook,
	lookup func(context.Context, faults.Event, bool, error) (bool, error), obs *engine.Observer, workers bool) (*engine.Engine, *engine.Operation[In, S, Out]) {
	t.Helper()
	op, err := m.Operation(pool, run.Env)
	if err != nil {
		t.Fatalf("idemflowtest: build the operation: %v", err)
	}
	cfg := m.config()
	cfg.Operations = []engine.Definition{op}
	cfg.Faults.Hook = hook
	cfg.Faults.Lookup = lookup
	if obs != nil {
		cfg.Observer = engine.Observers(cfg.Observer, obs)
	}
	e := NewEngine(t, pool, &cfg)
	if workers {
		if err := e.StartWorkers(t.Context()); err != nil {
			t.Fatalf("idemflowtest: start workers: %v", err)
		}
	}
	return e, op
}

// finish starts the operation, or finds it as a client's retry does, waits for
// it to finish or be parked, its waits satisfied by WaitFunc, and checks the
// books.
func (m Matrix[In, S, Out]) finish(t *testing.T, e *engine.Engine, op *engine.Operation[In, S, Out], run *Run, name string) Result {
	t.Helper()
	return m.finishWith(t, e, op, run, m.waiter(e), name)
}

// finishWith is finish with the waits satisfied by w.
func (m Matrix[In, S, Out]) finishWith(t *testing.T, e *engine.Engine, op *engine.Operation[In, S, Out], run *Run, w *waiter, name string) Result {
	t.Helper()
	res := Result{Point: name}
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	started, err := engine.Start(ctx, e, op, scope, key, m.input(run.Env), nil)
	if err != nil {
		res.Err = fmt.Errorf("start (as a client's retry): %w", err)
		return res
	}
	res.Found = !started.Created
	info, err := waitFor(ctx, w, started)
	if err != nil {
		res.Err = fmt.Errorf("the operation neither finished nor was parked within %s: %w", waitTimeout, err)
		return res
	}
	full, err := e.Get(ctx, info.ID)
	if err != nil {
		res.Err = fmt.Errorf("read the operation: %w", err)
		return res
	}
	res.Status, res.Parked = full.Status, full.Parked
	res.Err = run.Check(ctx, full)
	return res
}

// crashAt runs the operation in a child killed at p, then resumes and checks it.
func (m Matrix[In, S, Out]) crashAt(t *testing.T, p point) Result {
	t.Helper()
	pl := newPlan(t, "", "")
	switch p.Point {
	case pointAfterDeclined:
		pl = newPlan(t, p.Step, FaultDeclined)
	case pointAfterPending:
		pl = newPlan(t, p.Step, FaultPending)
	}
	url, pool, run := m.prepare(t, pl)
	if pl.fault != "" {
		// The proxies read the step's key while the child runs.
		op, err := m.Operation(pool, run.Env)
		if err != nil {
			t.Fatalf("idemflowtest: build the operation: %v", err)
		}
		reader := NewEngine(t, pool, &engine.Config{Logger: logger()}, op)
		pl.setInfo(func(ctx context.Context) (*engine.Info, error) { return reader.GetByKey(ctx, scope, key) })
	}
	env, err := json.Marshal(run.Env)
	if err != nil {
		t.Fatalf("idemflowtest: encode Env: %v", err)
	}
	pt, _ := json.Marshal(p)
	reached, err := runChild(t, map[string]string{envURL: url, envPoint: string(pt), envEnv: string(env)})
	res := Result{Point: p.name()}
	switch {
	case err != nil:
		res.Err = err
		return res
	case !reached:
		// The first run reached it; a second may take another path (a lookup
		// that finds nothing to look up, a timer whose moment came before its
		// step). Nothing crashed: check all the same.
		t.Logf("the child finished without reaching %s", p.name())
	}
	// A wait step's point: the process that takes the operation over must
	// decide its wait once.
	var decided *waitCount
	var obs *engine.Observer
	if reached && p.Kind == engine.StepKindWait {
		decided = &waitCount{step: p.Step}
		obs = decided.observer()
	}
	e, op := m.engineWith(t, pool, run, nil, nil, obs, false)
	if reached && p.Point == pointWaiting && p.Wait == engine.WaitTimer {
		// The moment comes while no process is up: the new one must carry
		// it out as it starts.
		if err := sleepPast(t.Context(), e, p.Step); err != nil {
			return Result{Point: p.name(), Err: err}
		}
	}
	if err := e.StartWorkers(t.Context()); err != nil {
		t.Fatalf("idemflowtest: start workers: %v", err)
	}
	res = m.finish(t, e, op, run, p.name())
	res.Err = errors.Join(res.Err, pl.result())
	if decided != nil {
		res.Err = errors.Join(res.Err, decided.check())
	}
	return res
}

// runChild re-executes the test binary to run t again as a child with env, and
// kills it with SIGKILL once it reports that it reached its crash point. It
// returns false when the child finished without reaching it.
func runChild(t *testing.T, env map[string]string) (bool, error) {
	t.Helper()
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pattern, "/"), "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+t.Name())
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return false, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start the child: %w", err)
	}
	type outcome struct {
		reached, notReached bool
	}
	done := make(chan outcome, 1)
	var out strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		var o outcome
		for sc.Scan() {
			line := sc.Text()
			out.WriteString(line + "\n")
			if strings.Contains(line, markReached) {
				o.reached = true
				break
			}
			if strings.Contains(line, markNotReached) {
				o.notReached = true
				break
			}
		}
		done <- o
	}()
	select {
	case o := <-done:
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if o.reached {
			return true, nil
		}
		if o.notReached {
			return false, nil
		}
		return false, fmt.Errorf("the child ended without reaching its crash point:\n%s", out.String())
	case <-time.After(childTimeout):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return false, fmt.Errorf("the child did not reach its crash point in %s:\n%s", childTimeout, out.String())
	}
}

// child is the run that the crash matrix kills: it starts the operation and
// blocks at the point named in its environment.
func (m Matrix[In, S, Out]) child(t *testing.T, p point) {
	var env map[string]string
	if err := json.Unmarshal([]byte(os.Getenv(envEnv)), &env); err != nil {
		t.Fatalf("idemflowtest child: env: %v", err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envURL))
	if err != nil {
		t.Fatalf("idemflowtest child: %v", err)
	}
	op, err := m.Operation(pool, env)
	if err != nil {
		t.Fatalf("idemflowtest child: build the operation: %v", err)
	}
	cfg := m.config()
	cfg.Operations = []engine.Definition{op}
	cfg.Lease = TestLease
	crash := func() {
		fmt.Println(markReached)
		_ = os.Stdout.Sync()
		time.Sleep(time.Hour) // until SIGKILL
	}
	cfg.Faults.Hook = func(_ context.Context, ev faults.Event) error {
		if ev.Step == p.Step && ev.Point == p.Point {
			crash()
		}
		return nil
	}
	if p.Point == pointAfterDeclined || p.Point == pointAfterPending {
		// The attempt has read the service's answer, and its checkpoint is
		// not committed: the Observer hears of it first.
		cfg.Observer = engine.Observers(cfg.Observer, &engine.Observer{
			StepAttempted: func(_ context.Context, ev engine.StepEvent) {
				if ev.Step == p.Step && ev.Outcome != engine.AttemptSucceeded {
					crash()
				}
			},
		})
	}
	e, err := engine.New(pool, &cfg)
	if err != nil {
		t.Fatalf("idemflowtest child: %v", err)
	}
	// Workers too: a point after a retry handed to River is reached there.
	if err := e.StartWorkers(ctx); err != nil {
		t.Fatalf("idemflowtest child: %v", err)
	}
	started, err := engine.Start(ctx, e, op, scope, key, m.input(env), nil)
	if err != nil {
		t.Fatalf("idemflowtest child: start: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	w := m.waiter(e)
	w.seen = func(_ *engine.Info, s engine.StepInfo) bool {
		if p.Point == pointWaiting && s.Name == p.Step {
			crash()
		}
		return true
	}
	if _, err := waitFor(wctx, w, started); err != nil {
		t.Fatalf("idemflowtest child: wait: %v", err)
	}
	fmt.Println(markNotReached)
}

// withFault runs the operation with fault on the first attempt of step.
func (m Matrix[In, S, Out]) withFault(t *testing.T, step string, fault Fault) Result {
	t.Helper()
	pl := newPlan(t, step, fault)
	_, pool, run := m.prepare(t, pl)
	if len(run.Services) > 0 {
		return m.atTransport(t, pool, run, pl)
	}
	var (
		once sync.Once
		mu   sync.Mutex
		// until is when the late call lands, or stops being pending.
		until time.Time
	)
	hook := func(_ context.Context, ev faults.Event) error {
		if ev.Step != step || ev.Attempt != 1 {
			return nil
		}
		var err error
		switch {
		case fault == FaultError && ev.Point == faults.PointBefore:
			err = errors.New("idemflowtest: injected failure of the call before it reached the service")
		case fault == FaultLostResponse && ev.Point == faults.PointAfterEffect:
			err = errors.New("idemflowtest: injected loss of the call's answer (connection reset)")
		case fault == FaultTimeout && ev.Point == faults.PointAfterEffect:
			err = fmt.Errorf("idemflowtest: injected timeout waiting for the call's answer: %w", context.DeadlineExceeded)
		case fault == FaultLateLanding && ev.Point == faults.PointAfterEffect:
			err = engine.Permanent(fmt.Errorf("idemflowtest: injected timeout of a call that lands later: %w", context.DeadlineExceeded))
		case fault == FaultPending && ev.Point == faults.PointAfterEffect:
			err = engine.Accepted("", "idemflowtest: injected: the service accepted the call as pending")
		}
		if err != nil {
			injected := false
			once.Do(func() { injected = true })
			if injected {
				mu.Lock()
				until = time.Now().Add(max(LateLanding, PendingFor))
				mu.Unlock()
				return err
			}
		}
		return nil
	}
	lookup := func(_ context.Context, ev faults.Event, found bool, err error) (bool, error) {
		mu.Lock()
		hidden := ev.Step == step && time.Now().Before(until)
		mu.Unlock()
		switch {
		case !hidden:
			return found, err
		case fault == FaultLateLanding:
			return false, nil // not landed yet
		case fault == FaultPending:
			return false, engine.Accepted("", "idemflowtest: injected: still pending")
		}
		return found, err
	}
	e, op := m.engineWith(t, pool, run, hook, lookup, nil, true)
	return m.finish(t, e, op, run, step+"/"+string(fault))
}

// atTransport runs the operation with pl's fault injected by the proxies of
// run's Services.
func (m Matrix[In, S, Out]) atTransport(t *testing.T, pool *pgxpool.Pool, run *Run, pl *plan) Result {
	t.Helper()
	hook := func(_ context.Context, ev faults.Event) error {
		if pl.fault == FaultLateLanding && ev.Step == pl.step && ev.Point == faults.PointBefore && ev.Attempt > 1 && !pl.hasLanded() {
			// Only the lookup decides: the service is out of reach for the
			// step's key until its late call has landed.
			return engine.Permanent(errors.New("idemflowtest: injected: the service cannot be reached until the late call lands"))
		}
		return nil
	}
	e, op := m.engine(t, pool, run, hook, true)
	pl.setInfo(func(ctx context.Context) (*engine.Info, error) { return e.GetByKey(ctx, scope, key) })
	res := m.finish(t, e, op, run, pl.step+"/"+string(pl.fault))
	res.Err = errors.Join(res.Err, pl.result())
	return res
}

// report logs the table of results and fails t for each broken invariant,
// when fail is set.
func (m Matrix[In, S, Out]) report(t *testing.T, results []Result, fail bool) {
	t.Helper()
	if results == nil {
		return // the child
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-36s %-10s %-12s %-7s %s\n", "point", "retry", "status", "parked", "invariants")
	broken := 0
	for _, r := range results {
		verdict := "ok"
		if r.Err != nil {
			verdict = "BROKEN: " + r.Err.Error()
			broken++
		}
		retry := "new"
		if r.Found {
			retry = "found"
		}
		fmt.Fprintf(&b, "%-36s %-10s %-12s %-7t %s\n", r.Point, retry, r.Status, r.Parked, verdict)
	}
	t.Logf("idemflowtest matrix, %d points, %d broken:\n%s", len(results), broken, b.String())
	if fail && broken > 0 {
		t.Errorf("idemflowtest: %d of %d points broke an invariant (see the table above)", broken, len(results))
	}
}
