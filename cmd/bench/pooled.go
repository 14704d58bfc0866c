package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pgcluster"
)

// modePooled is modeEngine through a PgBouncer in transaction mode that the
// benchmark starts in front of its server: the application's and the
// provider's pools connect to it, made by engine.BoundPool with
// PoolOpts.Pooler (no prepared statement kept on a server connection), and
// the engine runs with Config.Pooler (River polls; no liveness lock, the lease
// bounds a takeover). The database's creation, its migrations and the
// statistics stay on the direct connection. Run it beside modeEngine
// (-mode engine,pooled) for the two in turn, in every round.
const modePooled = "pooled"

// pooledPoolSize is PgBouncer's default_pool_size: the server connections
// that the pooled mode's two pools share.
const pooledPoolSize = 20

// startPgBouncer starts the pooled mode's PgBouncer in front of the server, and
// returns the configuration of a pool on the benchmark's database through it.
func (s *server) startPgBouncer(ctx context.Context, serverURL string) (*pgxpool.Config, func(), error) {
	dir, err := os.MkdirTemp("", "idemflow-bench-pgbouncer-")
	if err != nil {
		return nil, nil, err
	}
	pgb, err := pgcluster.StartPgBouncer(ctx, &pgcluster.PgBouncerConfig{
		Dir: dir, ServerURL: serverURL, PoolSize: pooledPoolSize, Restart: true,
		// Server connections idle for a second are closed, so that the wait for
		// the database's sessions to end (flushIdle) ends.
		Settings: map[string]string{"server_idle_timeout": "1"},
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("start PgBouncer: %w", err)
	}
	stop := func() {
		_ = pgb.Stop()
		_ = os.RemoveAll(dir)
	}
	cfg, err := pgxpool.ParseConfig(pgb.URL(s.dbName))
	if err != nil {
		stop()
		return nil, nil, err
	}
	engine.BoundPool(cfg, &engine.PoolOpts{Pooler: true})
	return cfg, stop, nil
}
