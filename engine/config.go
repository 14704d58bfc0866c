package engine

import (
	"errors"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/reconcile"
)

// Off, given to a field of Config or OperationOpts whose documentation
// offers it, turns that bound or job off. Zero always means the default.
const Off = -1

// Config configures an Engine. The zero value of every field but Operations
// takes its default; a field that can be turned off says so, and takes Off.
type Config struct {
	// Operations are the operation types this engine runs. Names must be unique.
	Operations []Definition
	// Logger receives the engine's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// Recovery: how a run holds its operation, and how another process takes
	// it over when the run's process dies.

	// Lease is how long a run holds an operation without renewing its claim. A run
	// renews it every Lease/3 while it works; an operation whose holder stopped
	// renewing (it crashed) is taken over by another process once the lease has
	// expired. Defaults to 15 seconds.
	Lease time.Duration
	// SweepInterval is how often each process with started workers looks for
	// operations whose lease expired, to resume them. Defaults to a third of
	// the lease, at most 5 seconds.
	SweepInterval time.Duration
	// Takeover configures how a process with workers takes over a dead
	// process's operations at once, rather than when their lease ends.
	Takeover TakeoverConfig
	// InlineRetryMax is the longest backoff that a run waits out itself, holding
	// its lease, before it tries a failed step again. A longer backoff hands the
	// operation to a River job scheduled at the backoff (River promotes scheduled
	// jobs every 5 seconds, so a short backoff through it would take seconds).
	// Defaults to 5 seconds; Off sends every retry through River.
	InlineRetryMax time.Duration

	// Limits: what one process takes on at once.

	// MaxInFlight bounds the first attempts that run in this process at once:
	// beyond it Start answers ErrOverloaded at once, reserving nothing (resumes
	// are bounded by River.MaxWorkers). A run's place, here and in
	// MaxInFlightPerScope, is free again before its starter, or Wait, hears
	// that it ended. Defaults to 1000; Off: no bound.
	MaxInFlight int
	// MaxInFlightPerScope bounds the operations of one scope (one client)
	// running in this process at once, first attempts and resumes together:
	// beyond it Start answers ErrScopeBusy at once, reserving nothing, and a
	// resume of that scope is put back for a second (River's job snoozed), so
	// that one client's burst leaves the others their share of MaxInFlight and
	// River.MaxWorkers. Defaults to no bound (as Off). To bound a scope across
	// processes, give it a bound per process that sums to what it may have.
	MaxInFlightPerScope int
	// AcquireTimeout bounds the wait for a connection of the main pool for a
	// step's transaction: a starved pool fails the attempt (a first attempt's
	// reservation: the Start, unavailable, see IsUnavailable) rather than wait
	// for ever. Defaults to 5 seconds; Off: no bound.
	AcquireTimeout time.Duration
	// GroupCommit bounds the transactions whose commits the engine shares in
	// one round trip and one commit when they are ready at the same moment
	// (a group: see docs/architecture.md). Only a transaction that sent
	// nothing before its commit joins one, and only when the engine's
	// senders are all busy: nothing waits for a group to fill. Defaults to
	// 16; Off commits each transaction alone.
	GroupCommit int
	// PollInterval bounds how long Wait sleeps between reads of an operation that
	// runs in another process. Defaults to 500 milliseconds.
	PollInterval time.Duration

	// Retention: how long a finished operation keeps its key and answer.

	// Retention is how long a finished operation, and so its key and stored
	// answer, is kept before the retention job deletes it (OperationOpts.Retention
	// overrides it per type). Defaults to 24 hours; Off keeps them for ever.
	Retention time.Duration
	// RetentionInterval is how often the leader runs the retention job. Defaults
	// to 1 minute; Off: never (nothing is deleted).
	RetentionInterval time.Duration

	// Connections.

	// ControlPool, when set, is the pool of the engine's own work: lease
	// renewals, the sweeper, the retention job, and River's producer, leader
	// and job completions. A pool of its own (4 connections are plenty) keeps
	// the application's traffic on the main pool from starving the leases.
	// Defaults to the main pool.
	ControlPool *pgxpool.Pool
	// Pooler says that the pools reach PostgreSQL through a connection pooler
	// in transaction mode (PgBouncer's pool_mode=transaction), which keeps no
	// session between transactions: River polls for jobs (its PollOnly: no
	// LISTEN), and the liveness lock is held only on Takeover.ConnConfig, a
	// direct connection; without one, a dead process's operations are taken
	// over when their lease ends. New refuses a pool that keeps prepared
	// statements on the server: make the pools with BoundPool and
	// PoolOpts.Pooler. Migrate needs no session, and runs through the pooler.
	Pooler bool
	// River configures the engine's River client: its queue, the
	// application's workers and queues on it, its middleware, its rescue of
	// stuck jobs.
	River RiverConfig

	// Integrations.

	// Observer, when not nil, is told what the engine does, for metrics and
	// traces (Observers combines several).
	Observer *Observer
	// Reconcile configures reconciliation: the outside services whose records
	// are checked against the steps (see Engine.Reconcile).
	Reconcile reconcile.Config

	// Faults holds hooks for tests and fault injection (idemflowtest sets
	// them), which production code leaves zero.
	Faults Faults
}

// Faults are the hooks of fault injection (Config.Faults): a Hook called at
// each point of every step attempt, to crash the process there or make the
// attempt fail or panic, and a Lookup that may change what an external
// step's lookup answers.
type Faults = faults.Config

// RiverConfig configures the engine's River client (Config.River).
type RiverConfig struct {
	// Queue is the River queue of the engine's jobs. Defaults to "idemflow".
	Queue string
	// MaxWorkers is how many operations the River workers of this process resume
	// at once. Defaults to 20.
	MaxWorkers int
	// Middleware is installed on the client (River's Config.Middleware):
	// OpenTelemetry's for River jobs, for instance (rivercontrib's otelriver).
	Middleware []rivertype.Middleware
	// Workers, when set, adds the application's workers to the engine's
	// client (river.AddWorker), and Queues their queues, beside the engine's
	// own (Queue): one client, so that River's leader, which discards
	// stuck jobs of kinds it has no worker for, knows the application's too.
	// It is given the engine being made, which its workers may keep (such as
	// entry/riverjob's): nothing runs before StartWorkers.
	Workers func(e *Engine, workers *river.Workers) error
	Queues  map[string]river.QueueConfig
	// RescueStuckJobsAfter is how long a River job may stay running before
	// River's leader takes it for stuck (its process died) and runs it again
	// (River's Config.RescueStuckJobsAfter; zero: River's hour). The engine's
	// own jobs are safe to run twice (a run claims its operation); make the
	// application's (Workers) so too, as entry/riverjob's are.
	RescueStuckJobsAfter time.Duration
}

// The defaults of Config, and what Off stands for where it is offered.
const (
	defaultLease             = 15 * time.Second
	defaultSweepInterval     = 5 * time.Second
	defaultPollInterval      = 500 * time.Millisecond
	defaultQueue             = "idemflow"
	defaultMaxWorkers        = 20
	defaultInlineRetryMax    = 5 * time.Second
	defaultRetention         = 24 * time.Hour
	defaultRetentionInterval = time.Minute
	defaultMaxInFlight       = 1000
	defaultAcquireTimeout    = 5 * time.Second
	defaultGroupCommit       = 16
	// groupSenders is how many groups (or lone transactions) the grouper
	// has in flight at once before it queues.
	groupSenders = 4
	// defaultWindow is the outcome window of an external step that sets none.
	defaultWindow = 5 * time.Minute
	// defaultTakeoverInterval is how often a process looks for a dead
	// process's operations.
	defaultTakeoverInterval = 250 * time.Millisecond
	// defaultActor is the actor of a request whose context names none.
	defaultActor = "operator"
	// The defaults of RetryPolicy.
	defaultRetryBase        = time.Second
	defaultRetryFactor      = 2.0
	defaultRetryCap         = 5 * time.Minute
	defaultRetryMaxAttempts = 10
	// forever is a retention turned off: about 292 years.
	forever = time.Duration(math.MaxInt64)
)

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Lease == 0 {
		c.Lease = defaultLease
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = min(c.Lease/3, defaultSweepInterval)
	}
	if c.PollInterval == 0 {
		c.PollInterval = defaultPollInterval
	}
	if c.River.Queue == "" {
		c.River.Queue = defaultQueue
	}
	if c.River.MaxWorkers == 0 {
		c.River.MaxWorkers = defaultMaxWorkers
	}
	switch {
	case c.InlineRetryMax == 0:
		c.InlineRetryMax = defaultInlineRetryMax
	case c.InlineRetryMax < 0:
		c.InlineRetryMax = Off
	}
	switch {
	case c.Retention == 0:
		c.Retention = defaultRetention
	case c.Retention < 0:
		c.Retention = forever
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = defaultRetentionInterval
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = defaultMaxInFlight
	}
	if c.AcquireTimeout == 0 {
		c.AcquireTimeout = defaultAcquireTimeout
	}
	if c.GroupCommit == 0 {
		c.GroupCommit = defaultGroupCommit
	}
	if c.Takeover.Interval == 0 {
		c.Takeover.Interval = defaultTakeoverInterval
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Lease < 100*time.Millisecond:
		return errors.New("lease must be at least 100ms")
	case c.SweepInterval < 10*time.Millisecond:
		return errors.New("sweep interval must be at least 10ms")
	case c.PollInterval <= 0:
		return errors.New("poll interval must be positive")
	case c.River.MaxWorkers < 1:
		return errors.New("river's max workers must be at least 1")
	}
	return nil
}
