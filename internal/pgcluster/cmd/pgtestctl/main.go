// Command pgtestctl controls the PostgreSQL cluster that this module's tests share
// (pgcluster.TestDataDir).
//
// Usage:
//
//	pgtestctl url    start the cluster unless it runs, and print its admin URL
//	pgtestctl stop   stop the cluster if it runs (CI runs it last, so no server is left)
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemflow/idemflow/internal/pgcluster"
)

func main() {
	if len(os.Args) != 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Args[1], logger); err != nil {
		logger.ErrorContext(ctx, "pgtestctl failed", slog.String("error", err.Error()))
		stop()
		os.Exit(1)
	}
}

// run runs one command.
func run(ctx context.Context, command string, logger *slog.Logger) error {
	cfg := pgcluster.TestClusterConfig()
	cfg.Logger = logger
	switch command {
	case "url":
		c, err := pgcluster.Ensure(ctx, cfg)
		if err != nil {
			return fmt.Errorf("ensure test cluster: %w", err)
		}
		fmt.Println(c.URL("postgres"))
	case "stop":
		stopped, err := pgcluster.Stop(ctx, cfg)
		if err != nil {
			return fmt.Errorf("stop test cluster: %w", err)
		}
		if !stopped {
			logger.InfoContext(ctx, "test cluster is not running", slog.String("data_dir", cfg.DataDir))
		}
	default:
		usage()
	}
	return nil
}

// usage prints how to call the command and exits.
func usage() {
	fmt.Fprintln(os.Stderr, "usage: pgtestctl url|stop")
	os.Exit(2)
}
