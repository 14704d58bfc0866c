package idemflowtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
)

// The timings of an engine made by Engine or NewEngine where its configuration
// sets none: short, so that a resume after a crash takes about a second.
const (
	TestLease         = time.Second
	TestSweepInterval = 50 * time.Millisecond
	TestPollInterval  = 20 * time.Millisecond
)

// stopTimeout bounds the Stop of a test's engine at cleanup.
const stopTimeout = 30 * time.Second

// Engine returns an engine on pool for tb, with its workers started, stopped
// when tb ends (a Stop that fails, or takes over 30 seconds, fails tb).
//
// cfg may be nil. Its zero Lease, SweepInterval and PollInterval take
// TestLease, TestSweepInterval and TestPollInterval, so that retries and
// resumes after a crash happen within the test; a nil Logger logs warnings and
// errors only (the environment variable IDEMFLOWTEST_LOG sets another level);
// the rest is the engine's defaults. defs are added to its Operations. A test
// that sets the engine's fault hooks (cfg.Faults) uses HookEvent and the Point
// constants.
//
//	func TestRefund(t *testing.T) {
//		pool := idemflowtest.Pool(t, nil)
//		e := idemflowtest.Engine(t, pool, nil, refund)
//		s, err := engine.Start(t.Context(), e, refund, "shop", "order-1", in, nil)
//		require.NoError(t, err)
//		require.Equal(t, engine.StatusSucceeded, idemflowtest.Wait(t, e, s).Status)
//	}
func Engine(tb testing.TB, pool *pgxpool.Pool, cfg *engine.Config, defs ...engine.Definition) *engine.Engine {
	tb.Helper()
	e := NewEngine(tb, pool, cfg, defs...)
	require.NoError(tb, e.StartWorkers(context.WithoutCancel(tb.Context())), "idemflowtest: start workers")
	return e
}

// NewEngine is Engine without its workers, as engine.New is to StartWorkers:
// Start still runs an operation's first attempt in the caller, but nothing
// retries, resumes, sweeps or deletes in the background until the test calls
// StartWorkers (or Sweep, or a River job of its own). It is for a test that
// drives the engine by hand, or plays a process that only starts operations.
// A test may Stop the engine itself; the Stop at cleanup is then a no-op.
func NewEngine(tb testing.TB, pool *pgxpool.Pool, cfg *engine.Config, defs ...engine.Definition) *engine.Engine {
	tb.Helper()
	c := engine.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Operations = append(append([]engine.Definition(nil), c.Operations...), defs...)
	if c.Logger == nil {
		c.Logger = logger()
	}
	if c.Lease == 0 {
		c.Lease = TestLease
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = TestSweepInterval
	}
	if c.PollInterval == 0 {
		c.PollInterval = TestPollInterval
	}
	e, err := engine.New(pool, &c)
	require.NoError(tb, err, "idemflowtest: new engine")
	tb.Cleanup(func() {
		// tb's context has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := e.Stop(ctx); err != nil {
			tb.Errorf("idemflowtest: stop the engine: %v", err)
		}
	})
	return e
}

// Wait waits at most 30 seconds for the operation to finish or be parked, and
// returns it with its steps.
func Wait(tb testing.TB, e *engine.Engine, s *engine.Started) *engine.Info {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 30*time.Second)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(tb, err, "idemflowtest: wait for operation %s", s.ID)
	full, err := e.Get(ctx, info.ID)
	require.NoError(tb, err)
	return full
}
