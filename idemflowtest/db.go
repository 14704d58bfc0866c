package idemflowtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// DatabaseURL returns the URL of a new database for tb, with idemflow's tables
// and River's and nothing in them. It is dropped when tb ends, or kept (its URL
// logged) when tb failed. See the package documentation for the server it is
// made on.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	return testdb.URL(tb)
}

// Pool returns a pool on a new database for tb (see DatabaseURL), closed when tb
// ends. setup, when not nil, runs on it first: the service's own migrations or
// rows.
func Pool(tb testing.TB, setup func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	tb.Helper()
	return openPool(tb, DatabaseURL(tb), setup)
}

func openPool(tb testing.TB, url string, setup func(ctx context.Context, pool *pgxpool.Pool) error) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(tb.Context(), url)
	require.NoError(tb, err, "idemflowtest: open pool")
	tb.Cleanup(pool.Close)
	if setup != nil {
		require.NoError(tb, setup(tb.Context(), pool), "idemflowtest: set up the database")
	}
	return pool
}

// The timings of an engine made by Engine: short, so that a resume after a
// crash takes about a second.
const (
	TestLease         = time.Second
	TestSweepInterval = 50 * time.Millisecond
	TestPollInterval  = 20 * time.Millisecond
)

// Engine returns an engine on pool for tb, with workers started, stopped when tb
// ends. cfg may be nil; its zero Lease, SweepInterval and PollInterval take
// TestLease, TestSweepInterval and TestPollInterval, and defs are added to its
// Operations.
func Engine(tb testing.TB, pool *pgxpool.Pool, cfg *engine.Config, defs ...engine.Definition) *engine.Engine {
	tb.Helper()
	e := newEngine(tb, pool, cfg, defs...)
	require.NoError(tb, e.StartWorkers(tb.Context()), "idemflowtest: start workers")
	return e
}

func newEngine(tb testing.TB, pool *pgxpool.Pool, cfg *engine.Config, defs ...engine.Definition) *engine.Engine {
	tb.Helper()
	c := engine.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Operations = append(append([]engine.Definition(nil), c.Operations...), defs...)
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
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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

// ExamplePool returns a pool on a new database for an example function, which
// has no testing.TB, named after name, and the function that closes the pool
// and drops the database. It panics when the database cannot be made: an
// example cannot fail otherwise.
func ExamplePool(name string) (*pgxpool.Pool, func()) {
	return testdb.ExamplePool(name)
}
