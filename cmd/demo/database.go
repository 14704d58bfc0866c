package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

// openDatabase connects to DATABASE_URL or, when it is unset, to the private
// cluster in the data directory, starting it unless it runs (a cluster left
// running by a killed demo is reused). stop stops the cluster when this process
// started it, and does nothing otherwise.
func openDatabase(ctx context.Context, cfg *config, logger *slog.Logger) (pool *pgxpool.Pool, stop func(context.Context), err error) {
	stop = func(context.Context) {}
	url := cfg.databaseURL
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
	poolCfg.MaxConns = max(poolCfg.MaxConns, 20)
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
