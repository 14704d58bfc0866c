package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/store"
)

// Engine starts, runs and resumes operations. Make one with New; it is safe for
// concurrent use.
type Engine struct {
	pool *pgxpool.Pool
	// control is the pool of the engine's own work (Config.ControlPool).
	control *pgxpool.Pool
	store   *store.Store
	// group shares the commits of transactions ready at the same moment
	// (Config.GroupCommit); nil when off.
	group  *grouper
	river  *river.Client[pgx.Tx]
	cfg    Config
	logger *slog.Logger
	// defs are the registered definitions by name and version; versions the
	// versions of each name, ascending.
	defs     map[defKey]*opDef
	versions map[string][]int32
	// settleWindows is the longest outcome window of the external steps of
	// each name's versions here: what a claim stores (nil: none calls out).
	settleWindows map[string]*time.Duration
	// processID names this process's engine in idemflow_process.
	processID uuid.UUID
	// waiting holds the ids of the operations this process has logged that it
	// cannot run (their version is not registered here): logged once each.
	waiting sync.Map

	// baseCtx outlives the requests that start operations: a first attempt goes on
	// when its caller stops waiting.
	baseCtx context.Context
	// idleRunners hands a first attempt to a goroutine that waits for one
	// (goRun).
	idleRunners chan func()
	cancelBase  context.CancelFunc
	runs        sync.WaitGroup
	sweeps      sync.WaitGroup

	mu       sync.Mutex
	stopping bool
	waiters  map[uuid.UUID][]chan *Info

	// waitLogged holds the operations this process said once it cannot run.
	waitLogged sync.Map
	// inFlight counts the first attempts running in this process.
	inFlight atomic.Int64
	// scopes counts, by scope, the runs in this process (first attempts and
	// resumes) while Config.MaxInFlightPerScope bounds them.
	scopes scopeCounts
	// workers is true once StartWorkers has started River here; warned once
	// an operation was handed to River without them.
	workers, warned atomic.Bool
	// liveKey is the key of this process's liveness lock while it holds it
	// (see TakeoverConfig), 0 otherwise: the first bytes of its runs' ids.
	liveKey atomic.Int32
	// schema is what this process knows of a database that a newer build
	// migrated (see Health).
	schema schemaWatch
	// timers keeps the moments of waits (timerLoop).
	timers timers
	// stranded holds the runs that stopped with the database away
	// (rescueLoop).
	stranded stranded
}

// handedToRiver warns, once per process, when an operation goes to a River job
// and this process runs no workers: unless another process runs them, it waits
// for ever.
func (e *Engine) handedToRiver(ctx context.Context) {
	if !e.workers.Load() && !e.warned.Swap(true) {
		e.logger.WarnContext(ctx, "an operation was handed to a River job, and this process runs no workers: "+
			"unless another process does, it waits; call Engine.StartWorkers")
	}
}

// New returns an Engine that keeps its operations in pool's database, which must
// have been migrated with Migrate (StartWorkers checks). cfg may be nil only when no operation type
// is needed (inspection only).
//
// It returns an error wrapping errDuplicateOperation when two operation types share
// a name.
func New(pool *pgxpool.Pool, cfg *Config) (*Engine, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("engine: invalid config: %w", err)
	}
	control := c.ControlPool
	if control == nil {
		control = pool
	}
	if err := c.checkPooler(pool, control); err != nil {
		return nil, fmt.Errorf("engine: invalid config: %w", err)
	}
	e := &Engine{
		pool:      pool,
		control:   control,
		store:     store.New(),
		cfg:       c,
		logger:    c.Logger,
		processID: uuid.New(),
		defs:      make(map[defKey]*opDef, len(c.Operations)),
		versions:  make(map[string][]int32),
		waiters:   make(map[uuid.UUID][]chan *Info),
		timers:    newTimers(),

		settleWindows: make(map[string]*time.Duration),
	}
	for _, op := range c.Operations {
		d := op.definition()
		if _, dup := e.defs[d.key()]; dup {
			return nil, fmt.Errorf("engine: %w: %q version %d", errDuplicateOperation, d.name, d.version)
		}
		for _, v := range e.versions[d.name] {
			if other := e.defs[defKey{d.name, int(v)}]; slices.Equal(other.names, d.names) {
				return nil, fmt.Errorf("engine: %w: %q versions %d and %d have the same steps %v; a new version is for a change of steps",
					errDuplicateOperation, d.name, other.version, d.version, d.names)
			}
		}
		e.defs[d.key()] = d
		e.versions[d.name] = append(e.versions[d.name], int32(d.version))
		slices.Sort(e.versions[d.name])
		if w := d.settleWindow(); w != nil && (e.settleWindows[d.name] == nil || *w > *e.settleWindows[d.name]) {
			e.settleWindows[d.name] = w
		}
	}
	if err := validateReconcile(&e.cfg.Reconcile, e.shortestRetention()); err != nil {
		return nil, fmt.Errorf("engine: invalid config: %w", err)
	}
	if c.GroupCommit > 1 {
		senders := groupSenders
		if c.Faults.GroupSenders > 0 {
			senders = c.Faults.GroupSenders
		}
		e.group = newGrouper(pool, c.AcquireTimeout, c.GroupCommit, senders, e.observeGroup, c.Logger)
	}
	e.baseCtx, e.cancelBase = context.WithCancel(context.Background())
	e.idleRunners = make(chan func())

	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &resumeWorker{e: e}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if err := river.AddWorkerSafely(workers, &retentionWorker{e: e}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if err := river.AddWorkerSafely(workers, &reconcileWorker{e: e}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if c.River.Workers != nil {
		if err := c.River.Workers(e, workers); err != nil {
			return nil, fmt.Errorf("engine: the application's River workers: %w", err)
		}
	}
	queues := map[string]river.QueueConfig{c.River.Queue: {MaxWorkers: c.River.MaxWorkers}}
	for name, q := range c.River.Queues {
		if name == c.River.Queue {
			return nil, fmt.Errorf("engine: River.Queues: %q is the engine's own queue (Config.River.Queue)", name)
		}
		queues[name] = q
	}
	var periodic []*river.PeriodicJob
	if c.RetentionInterval > 0 {
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(c.RetentionInterval), func() (river.JobArgs, *river.InsertOpts) {
			return retentionArgs{}, &river.InsertOpts{Queue: c.River.Queue}
		}, &river.PeriodicJobOpts{RunOnStart: true}))
	}
	if r := c.Reconcile; len(r.Sources) > 0 && r.Interval >= 0 {
		interval := r.Interval
		if interval == 0 {
			interval = reconcile.DefaultInterval
		}
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(interval), func() (river.JobArgs, *river.InsertOpts) {
			// One run at a time: a slow run is not joined by the next.
			return reconcileArgs{}, &river.InsertOpts{Queue: c.River.Queue, UniqueOpts: river.UniqueOpts{ByState: reconcileUniqueStates}}
		}, nil))
	}
	rc, err := river.NewClient(riverpgxv5.New(control), &river.Config{
		Logger:     c.Logger,
		Queues:     queues,
		Workers:    workers,
		Middleware: c.River.Middleware,
		// Zero keeps River's default.
		RescueStuckJobsAfter: c.River.RescueStuckJobsAfter,
		// The lease, not River's timeout, bounds a run: a long step renews its lease.
		JobTimeout:   -1,
		PeriodicJobs: periodic,
		// Through a pooler in transaction mode no LISTEN holds: River polls.
		PollOnly: c.Pooler,
	})
	if err != nil {
		return nil, fmt.Errorf("engine: river client: %w", err)
	}
	e.river = rc
	return e, nil
}

// StartWorkers starts the River workers that run retries and resumes in this
// process, the sweeper, and (on River's elected leader) the retention job. First attempts run without
// them, in the process that starts the operation.
//
// It returns an error when the database lacks migrations that this build has
// (call Migrate first), and one matching ErrIncompatibleSchema when a newer
// build migrated it with one that this build's statements do not fit (see
// Health).
func (e *Engine) StartWorkers(ctx context.Context) error {
	if err := checkSchema(ctx, e.control); err != nil {
		return fmt.Errorf("engine: %w; call engine.Migrate(ctx, pool) before StartWorkers", err)
	}
	if err := e.Health(ctx); errors.Is(err, ErrIncompatibleSchema) {
		return err
	}
	if err := e.river.Start(ctx); err != nil {
		return fmt.Errorf("engine: start river: %w", err)
	}
	e.workers.Store(true)
	if e.cfg.Takeover.Interval >= 0 {
		if err := e.holdLiveness(e.baseCtx); err != nil {
			e.logger.WarnContext(ctx, "no liveness lock: this process's operations are taken over when their lease ends, not when it dies", slog.Any("error", err))
		}
		e.sweeps.Add(1)
		go func() {
			defer e.sweeps.Done()
			e.takeOverLoop(e.baseCtx)
		}()
	}
	if err := e.heartbeat(ctx); err != nil {
		e.logger.WarnContext(ctx, "could not record this process for operators", slog.Any("error", err))
	}
	e.sweeps.Add(2)
	go func() {
		defer e.sweeps.Done()
		e.sweepLoop(e.baseCtx)
	}()
	e.stranded.mu.Lock()
	e.startRescue()
	e.stranded.mu.Unlock()
	go func() {
		defer e.sweeps.Done()
		if e.waits() {
			e.timerLoop(e.baseCtx)
		}
	}()
	return nil
}

// Stop stops accepting new operations and lets running first attempts and River
// jobs finish until ctx is done; then it cancels what still runs (those operations
// are resumed later, by this process or another, once their lease expires). It
// returns ctx's error when it had to cancel.
func (e *Engine) Stop(ctx context.Context) error {
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()

	riverErr := e.river.Stop(ctx)
	done := make(chan struct{})
	go func() {
		e.runs.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	e.cancelBase()
	e.sweeps.Wait()
	e.stopRescue()
	if e.workers.Load() {
		forgetCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		if err := e.store.ProcessDelete(forgetCtx, e.control, e.processID); err != nil {
			e.logger.WarnContext(ctx, "could not forget this process; operators see it until it ages out", slog.Any("error", err))
		}
		cancel()
	}
	if riverErr != nil {
		err = errors.Join(err, fmt.Errorf("engine: stop river: %w", riverErr),
			e.river.StopAndCancel(context.WithoutCancel(ctx)))
	}
	<-done
	return err
}

// River returns the River client the engine runs its jobs with, for an application
// that wants to enqueue jobs of its own in the same transactions.
func (e *Engine) River() *river.Client[pgx.Tx] { return e.river }

// Pool returns the pool the engine was made with (New's pool, not
// Config.ControlPool): the database of its operations, where an application
// begins the transactions that start them (StartTx) or record outcomes
// (RecordOutcome) with writes of its own, as the entry points do.
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// Registered reports whether op was given to New, so that Start accepts it.
func (e *Engine) Registered(op Definition) bool {
	_, err := e.registered(op)
	return err == nil
}

// Retention is how long this engine keeps a finished operation of d, and so
// its key, before its retention job may delete it: d's
// OperationOpts.Retention, else Config.Retention. It is stored with each
// operation as it finishes.
func (e *Engine) Retention(d Definition) time.Duration {
	return e.retention(d.definition())
}

func (e *Engine) registered(d Definition) (*opDef, error) {
	def := d.definition()
	if e.defs[def.key()] != def {
		return nil, fmt.Errorf("engine: %w: %q version %d", errNotRegistered, def.name, def.version)
	}
	return def, nil
}

// defKey names a definition: an operation type's name and version.
type defKey struct {
	name    string
	version int
}

func (d *opDef) key() defKey { return defKey{d.name, d.version} }

// def returns the registered definition of name and version, or nil.
func (e *Engine) def(name string, version int) *opDef { return e.defs[defKey{name, version}] }

// logWaiting logs, once per operation in this process, that the operation
// waits for a process that runs its version.
func (e *Engine) logWaiting(ctx context.Context, id uuid.UUID, name string, version int) {
	if _, seen := e.waiting.LoadOrStore(id, true); seen {
		return
	}
	e.logger.WarnContext(ctx, "operation left alone: this process does not run its version; it waits for a process that does",
		slog.String("operation_id", id.String()), slog.String("operation", name), slog.Int("version", version),
		slog.Any("versions_here", e.versions[name]))
}

// isStopping reports whether Stop has been called.
func (e *Engine) isStopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

// addRun counts a run that Stop must wait for. It returns false once the engine
// is stopping.
func (e *Engine) addRun() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopping {
		return false
	}
	e.runs.Add(1)
	return true
}
