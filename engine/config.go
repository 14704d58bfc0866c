package engine

import (
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/reconcile"
)

// Config configures an Engine. The zero value of every field but Operations takes
// its default.
type Config struct {
	// Operations are the operation types this engine runs. Names must be unique.
	Operations []Definition
	// Logger receives the engine's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Lease is how long a run holds an operation without renewing its claim. A run
	// renews it every Lease/3 while it works; an operation whose holder stopped
	// renewing (it crashed) is taken over by another process once the lease has
	// expired. Defaults to 15 seconds.
	Lease time.Duration
	// SweepInterval is how often each process with started workers looks for
	// operations whose lease expired, to resume them. Defaults to a third of
	// the lease, at most 5 seconds.
	SweepInterval time.Duration
	// PollInterval bounds how long Wait sleeps between reads of an operation that
	// runs in another process. Defaults to 500 milliseconds.
	PollInterval time.Duration
	// Queue is the River queue of the engine's jobs. Defaults to "idemflow".
	Queue string
	// MaxWorkers is how many operations the River workers of this process resume
	// at once. Defaults to 20.
	MaxWorkers int
	// InlineRetryMax is the longest backoff that a run waits out itself, holding
	// its lease, before it tries a failed step again. A longer backoff hands the
	// operation to a River job scheduled at the backoff (River promotes scheduled
	// jobs every 5 seconds, so a short backoff through it would take seconds).
	// Defaults to 5 seconds; a negative value sends every retry through River.
	InlineRetryMax time.Duration
	// Retention is how long a finished operation, and so its key and stored
	// answer, is kept before the retention job deletes it (OperationOpts.Retention
	// overrides it per type). Defaults to 24 hours.
	Retention time.Duration
	// RetentionInterval is how often the leader runs the retention job. Defaults
	// to 1 minute.
	RetentionInterval time.Duration
	// Observer, when not nil, is told what the engine does, for metrics and
	// traces (Observers combines several).
	Observer *Observer
	// River configures the engine's River client: the application's
	// workers and queues on it, its middleware, its rescue of stuck jobs.
	River RiverConfig
	// Test holds knobs for tests and fault injection, which production code
	// leaves zero.
	Test faults.Config
	// ControlPool, when set, is the pool of the engine's own work: lease
	// renewals, the sweeper, the retention job, and River's producer, leader
	// and job completions. A pool of its own (4 connections are plenty) keeps
	// the application's traffic on the main pool from starving the leases.
	// Defaults to the main pool.
	ControlPool *pgxpool.Pool
	// MaxInFlight bounds the first attempts that run in this process at once:
	// beyond it Start answers ErrOverloaded at once, reserving nothing (resumes
	// are bounded by MaxWorkers). Defaults to 1000; negative means no bound.
	MaxInFlight int
	// MaxInFlightPerScope bounds the operations of one scope (one client)
	// running in this process at once, first attempts and resumes together:
	// beyond it Start answers ErrScopeBusy at once, reserving nothing, and a
	// resume of that scope is put back for a second (River's job snoozed), so
	// that one client's burst leaves the others their share of MaxInFlight and
	// MaxWorkers. Zero means no bound. To bound a scope across processes, give
	// it a bound per process that sums to what it may have.
	MaxInFlightPerScope int
	// AcquireTimeout bounds the wait for a connection of the main pool for a
	// step's transaction: a starved pool fails the attempt (a first attempt's
	// reservation: the Start, with ErrUnavailable) rather than wait for ever.
	// Defaults to 5 seconds.
	AcquireTimeout time.Duration
	// Takeover configures how a process with workers takes over a dead
	// process's operations at once, rather than when their lease ends.
	Takeover TakeoverConfig
	// Pooler says that the pools reach PostgreSQL through a connection pooler
	// in transaction mode (PgBouncer's pool_mode=transaction), which keeps no
	// session between transactions: River polls for jobs (its PollOnly: no
	// LISTEN), and the liveness lock is held only on Takeover.ConnConfig, a
	// direct connection; without one, a dead process's operations are taken
	// over when their lease ends. New refuses a pool that keeps prepared
	// statements on the server: make the pools with BoundPool and
	// PoolOpts.Pooler. Migrate needs no session, and runs through the pooler.
	Pooler bool
	// Reconcile configures reconciliation: the outside services whose records
	// are checked against the steps (see Engine.Reconcile).
	Reconcile reconcile.Config
}

// RiverConfig configures the engine's River client (Config.River).
type RiverConfig struct {
	// Middleware is installed on the client (River's Config.Middleware):
	// OpenTelemetry's for River jobs, for instance (rivercontrib's otelriver).
	Middleware []rivertype.Middleware
	// Workers, when set, adds the application's workers to the engine's
	// client (river.AddWorker), and Queues their queues, beside the engine's
	// own (Config.Queue): one client, so that River's leader, which discards
	// stuck jobs of kinds it has no worker for, knows the application's too.
	// It is given the engine being made, which its workers may keep (such as
	// entry/riverjob's, made with riverjob.New(e, ...)): nothing runs before
	// StartWorkers.
	Workers func(e *Engine, workers *river.Workers) error
	Queues  map[string]river.QueueConfig
	// RescueStuckJobsAfter is how long a River job may stay running before
	// River's leader takes it for stuck (its process died) and runs it again
	// (River's Config.RescueStuckJobsAfter; zero: River's hour). The engine's
	// own jobs are safe to run twice (a run claims its operation); make the
	// application's (Workers) so too, as entry/riverjob's are.
	RescueStuckJobsAfter time.Duration
}

// The defaults of Config.
const (
	DefaultLease             = 15 * time.Second
	DefaultSweepInterval     = 5 * time.Second
	DefaultPollInterval      = 500 * time.Millisecond
	DefaultQueue             = "idemflow"
	DefaultMaxWorkers        = 20
	DefaultInlineRetryMax    = 5 * time.Second
	DefaultRetention         = 24 * time.Hour
	DefaultRetentionInterval = time.Minute
	DefaultMaxInFlight       = 1000
	DefaultAcquireTimeout    = 5 * time.Second
	// DefaultSettle is the settle window of an external step that does not set one.
	DefaultSettle = 5 * time.Minute
	// DefaultTakeoverInterval is how often a process looks for a dead process's
	// operations by default.
	DefaultTakeoverInterval = 250 * time.Millisecond
	// DefaultActor is the actor of a request whose context names none.
	DefaultActor = "operator"
	// The defaults of RetryPolicy.
	DefaultRetryBase        = time.Second
	DefaultRetryFactor      = 2.0
	DefaultRetryCap         = 5 * time.Minute
	DefaultRetryMaxAttempts = 10
)

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = min(c.Lease/3, DefaultSweepInterval)
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	if c.MaxWorkers == 0 {
		c.MaxWorkers = DefaultMaxWorkers
	}
	if c.InlineRetryMax == 0 {
		c.InlineRetryMax = DefaultInlineRetryMax
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = DefaultRetentionInterval
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.AcquireTimeout == 0 {
		c.AcquireTimeout = DefaultAcquireTimeout
	}
	if c.Takeover.Interval == 0 {
		c.Takeover.Interval = DefaultTakeoverInterval
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
	case c.MaxWorkers < 1:
		return errors.New("max workers must be at least 1")
	case c.Retention < 0, c.RetentionInterval < 0:
		return errors.New("retention and its interval must not be negative")
	case c.MaxInFlightPerScope < 0:
		return errors.New("max in flight per scope must not be negative")
	case c.AcquireTimeout < 0:
		return errors.New("acquire timeout must not be negative")
	}
	return nil
}
