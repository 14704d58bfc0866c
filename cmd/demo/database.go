package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

// openDatabase connects to DATABASE_URL or, when it is unset, to the private
// cluster in the data directory, starting it unless it runs (a cluster left
// running by a killed demo is reused). stop stops the cluster when this process
// started it, and does nothing otherwise.
func openDatabase(ctx context.Context, cfg *config, logger *slog.Logger) (pool *pgxpool.Pool, stop func(context.Context), err error) {
	return open(ctx, cfg, logger, true)
}

// openRunningDatabase opens DATABASE_URL, or else the private cluster that a
// demo runs in -data-dir: it starts, creates and changes nothing (for demo
// ops), and says so when no demo database runs there.
func openRunningDatabase(ctx context.Context, cfg *config, logger *slog.Logger) (*pgxpool.Pool, error) {
	pool, _, err := open(ctx, cfg, logger, false)
	return pool, err
}

func open(ctx context.Context, cfg *config, logger *slog.Logger, start bool) (pool *pgxpool.Pool, stop func(context.Context), err error) {
	stop = func(context.Context) {}
	url := cfg.databaseURL
	if url == "" && cfg.pooler {
		return nil, nil, errors.New("-pooler transaction: set DATABASE_URL to the pooler's URL (the private cluster has none)")
	}
	if url == "" && !start {
		cluster, err := pgcluster.Attach(ctx, &pgcluster.Config{DataDir: cfg.dataDir, Logger: logger})
		if errors.Is(err, pgcluster.ErrNotRunning) {
			return nil, nil, fmt.Errorf("no demo database runs in %s: start the demo first (go run ./cmd/demo), or give its -data-dir or DATABASE_URL", cfg.dataDir)
		}
		if err != nil {
			return nil, nil, err
		}
		url = cluster.URL("postgres")
	}
	if url == "" {
		if _, err := pgcluster.BinDir(); err != nil {
			return nil, nil, fmt.Errorf("no DATABASE_URL, and no PostgreSQL server binaries to start a private cluster (install the postgresql package, or set DATABASE_URL): %w", err)
		}
		cluster, err := pgcluster.Ensure(ctx, &pgcluster.Config{DataDir: cfg.dataDir, Logger: logger, OpenParents: true})
		if err != nil {
			return nil, nil, fmt.Errorf("start the private PostgreSQL cluster in %s (or set DATABASE_URL): %w", cfg.dataDir, err)
		}
		url = cluster.URL("postgres")
		logger.InfoContext(ctx, "using the private PostgreSQL cluster",
			slog.String("data_dir", cluster.DataDir()), slog.Bool("started_here", cluster.StartedHere()))
		if cluster.StartedHere() {
			stop = func(ctx context.Context) {
				if err := cluster.Stop(ctx); err != nil {
					logger.ErrorContext(ctx, "could not stop the private PostgreSQL cluster", slog.String("error", err.Error()))
				}
			}
		}
	}
	poolCfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop(ctx)
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	switch {
	case !cfg.pooler:
		poolCfg.MaxConns = max(poolCfg.MaxConns, 20)
	case !strings.Contains(url, "pool_max_conns"):
		// Through a pooler, client connections count against its
		// max_client_conn (100 by default: 16 processes of 3 and 2 fit), and
		// its server connections, shared by every process, bound the work.
		poolCfg.MaxConns = pooledConns
	}
	engine.BoundPool(poolCfg, &engine.PoolOpts{Lease: cfg.lease, Pooler: cfg.pooler})
	pool, err = pgxpool.NewWithConfig(ctx, poolCfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		stop(ctx)
		return nil, nil, errors.Join(errors.New("cannot reach the database"), err)
	}
	return pool, stop, nil
}

// controlConns are the connections of the engine's own pool: River's LISTEN,
// its producer and leader, lease renewals and the sweeper; pooledControlConns
// through a pooler, where River polls and the pooler's server connections are
// shared by every process.
const (
	controlConns       = 8
	pooledControlConns = 2
	// pooledConns is the main pool's size through a pooler, unless the URL
	// sets pool_max_conns.
	pooledConns = 3
)

// openControlPool opens the engine's own small pool on pool's database, so that
// the application's traffic cannot starve lease renewals.
func openControlPool(ctx context.Context, pool *pgxpool.Pool, cfg *config) (*pgxpool.Pool, error) {
	c := pool.Config().Copy()
	conns := int32(controlConns)
	if cfg.pooler {
		conns = pooledControlConns
	}
	c.MaxConns, c.MinConns = conns, conns // warm: a renewal never waits for a connection to be made
	// Its statements are short: a renewal that takes a third of the lease is
	// better failed, and tried again.
	engine.BoundPool(c, &engine.PoolOpts{Lease: cfg.lease, StatementTimeout: cfg.lease / 3, Pooler: cfg.pooler})
	control, err := pgxpool.NewWithConfig(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("open the engine's pool: %w", err)
	}
	return control, nil
}
