package main

import (
	"context"
	"crypto/rand"
	"embed"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/bench/internal/benchdb"
	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/workflows/refund"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationSet is the baseline's migrations (version table bench_schema_version).
var migrationSet = store.MigrationSet{Name: "bench", FS: migrations, Dir: "migrations"}

// databasePrefix starts the name of every database the benchmark creates.
const databasePrefix = "idemflow_bench_"

// server is the PostgreSQL server the benchmark runs on, and its database.
type server struct {
	// admin is a session on the server's maintenance database (DATABASE_URL's
	// own), which creates and drops the benchmark's database and reads the
	// server's statistics without adding to the benchmark database's.
	admin *pgx.Conn
	// dbConfig connects to the benchmark's database.
	dbConfig *pgxpool.Config
	dbName   string
	// url is the server's (DATABASE_URL's, or the private cluster's).
	url      string
	settings *benchdb.ServerSettingsRow
	// postmasterPID is the private cluster's postmaster, whose CPU time and its
	// children's the figures report; 0 for a server from DATABASE_URL.
	postmasterPID int
	// stop drops the database and, if this run started the cluster, stops it.
	stop func(context.Context)
}

// openServer connects to DATABASE_URL's server or starts the private cluster,
// creates a fresh database and migrates it.
func openServer(ctx context.Context, opts *options, logger *slog.Logger) (*server, error) {
	s := &server{stop: func(context.Context) {}}
	url := opts.databaseURL
	if url == "" {
		if _, err := pgcluster.BinDir(); err != nil {
			return nil, fmt.Errorf("no DATABASE_URL, and no PostgreSQL server binaries to start a private cluster: %w", err)
		}
		// The defaults: fsync, synchronous_commit and full_page_writes on.
		cluster, err := pgcluster.Ensure(ctx, &pgcluster.Config{DataDir: opts.dataDir, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("start the private PostgreSQL cluster in %s (or set DATABASE_URL): %w", opts.dataDir, err)
		}
		url = cluster.URL("postgres")
		s.postmasterPID = postmasterPID(cluster.DataDir())
		if cluster.StartedHere() {
			s.stop = func(ctx context.Context) {
				if err := cluster.Stop(ctx); err != nil {
					logger.ErrorContext(ctx, "could not stop the private PostgreSQL cluster", slog.String("error", err.Error()))
				}
			}
		}
	}
	s.url = url
	fail := func(err error) (*server, error) {
		s.stop(context.WithoutCancel(ctx))
		return nil, err
	}

	adminConfig, err := pgx.ParseConfig(url)
	if err != nil {
		return fail(fmt.Errorf("DATABASE_URL: %w", err))
	}
	s.admin, err = pgx.ConnectConfig(ctx, adminConfig)
	if err != nil {
		return fail(fmt.Errorf("connect to %s: %w", adminConfig.Host, err))
	}
	stopCluster := s.stop
	s.stop = func(ctx context.Context) {
		_ = s.admin.Close(ctx)
		stopCluster(ctx)
	}
	q := benchdb.New()
	if s.settings, err = q.ServerSettings(ctx, s.admin); err != nil {
		return fail(fmt.Errorf("read the server's settings: %w", err))
	}
	if s.settings.ServerVersionNum < 150000 {
		return fail(fmt.Errorf("PostgreSQL %s is too old: the statistics this benchmark reads need 15 or later", s.settings.ServerVersion))
	}

	s.dbName = databasePrefix + strings.ToLower(rand.Text()[:12])
	if err := s.exec(ctx, "CREATE DATABASE "+pgx.Identifier{s.dbName}.Sanitize()); err != nil {
		return fail(fmt.Errorf("create database %s: %w", s.dbName, err))
	}
	stopAdmin := s.stop
	s.stop = func(ctx context.Context) {
		if err := s.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{s.dbName}.Sanitize()+" WITH (FORCE)"); err != nil {
			logger.ErrorContext(ctx, "could not drop the benchmark's database", slog.String("database", s.dbName), slog.String("error", err.Error()))
		}
		stopAdmin(ctx)
	}

	dbConfig, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fail(fmt.Errorf("DATABASE_URL: %w", err))
	}
	dbConfig.ConnConfig.Database = s.dbName
	s.dbConfig = dbConfig
	if err := s.migrate(ctx, logger); err != nil {
		return fail(err)
	}
	return s, nil
}

// postmasterPID reads the first line of the data directory's postmaster.pid, or
// returns 0.
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// exec runs a statement that names a database. With fillHistory's VACUUM, it is
// the only SQL of the benchmark that does not go through sqlc: CREATE and DROP
// DATABASE take the name as an identifier, which no query parameter can be, and
// cannot run inside a function. The name is ours, and quoted.
func (s *server) exec(ctx context.Context, sql string) error {
	_, err := s.admin.Exec(ctx, sql)
	return err
}

// pool opens a pool on the benchmark's database of up to maxConns connections,
// with tracer (which may be nil).
func (s *server) pool(ctx context.Context, maxConns int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	return s.poolOf(ctx, s.dbConfig, maxConns, tracer)
}

// poolOf opens a pool of up to maxConns connections of config, with tracer.
func (s *server) poolOf(ctx context.Context, config *pgxpool.Config, maxConns int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg := config.Copy()
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open a pool on %s: %w", s.dbName, err)
	}
	return pool, nil
}

// migrate applies the engine's and River's migrations, the demo's ledger, the
// provider's schema and the baseline's table.
func (s *server) migrate(ctx context.Context, logger *slog.Logger) error {
	pool, err := s.pool(ctx, 4, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := engine.Migrate(ctx, pool, &engine.MigrateOpts{Logger: logger}); err != nil {
		return err
	}
	if err := refund.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := fakeprovider.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := migrationSet.Apply(ctx, pool, nil); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// createOrders records count orders of client, prefix1 to prefixN, each of
// amount, with their ledger moves.
func (s *server) createOrders(ctx context.Context, client, prefix string, count int, amount int64) error {
	pool, err := s.pool(ctx, 1, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := benchdb.New()
	n, err := q.OrderInsertSeries(ctx, pool, benchdb.OrderInsertSeriesParams{
		Client: client, Prefix: prefix, Amount: amount, Count: int32(count),
	})
	if err != nil {
		return fmt.Errorf("create orders: %w", err)
	}
	if n != int64(count) {
		return fmt.Errorf("created %d orders of %d: orders %s... exist already", n, count, prefix)
	}
	if _, err := q.LedgerMoveOrderSeries(ctx, pool, benchdb.LedgerMoveOrderSeriesParams{Client: client, Prefix: prefix}); err != nil {
		return fmt.Errorf("record the orders' ledger moves: %w", err)
	}
	return nil
}

// historyTables are the tables fillHistory fills.
const historyTables = "idemflow_operation, demo_order, demo_refund"

// fillHistory records count finished refunds of client, as the engine and the
// refund workflow leave them: orders prefix1 to prefixN of orderAmount, a
// succeeded refund of refundAmount of each (counted in the order's refunded),
// and the engine's operation (keys
// prefix1 to prefixN, finished in the past hour) with its 3 steps' checkpoints. Then it
// vacuums and analyzes the tables, as autovacuum would in time, and checkpoints, so that the
// timed modes meet a settled table and fresh statistics rather than the bulk
// insert's aftermath. The orders' and refunds' ledger entries are left out.
func (s *server) fillHistory(ctx context.Context, client, prefix string, count int, orderAmount, refundAmount int64) error {
	pool, err := s.pool(ctx, 1, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	q := benchdb.New()
	n, err := q.OrderInsertSeries(ctx, pool, benchdb.OrderInsertSeriesParams{
		Client: client, Prefix: prefix, Amount: orderAmount, Count: int32(count),
	})
	if err != nil {
		return fmt.Errorf("insert the orders: %w", err)
	}
	if n != int64(count) {
		return fmt.Errorf("inserted %d orders of %d", n, count)
	}
	if n, err = q.HistoryRefundInsertSeries(ctx, pool, benchdb.HistoryRefundInsertSeriesParams{
		Client: client, Prefix: prefix, Amount: refundAmount, Count: int32(count),
	}); err != nil {
		return fmt.Errorf("insert the refunds: %w", err)
	}
	if n != int64(count) {
		return fmt.Errorf("inserted the refunds of %d orders of %d", n, count)
	}
	if n, err = q.HistoryOperationInsertSeries(ctx, pool, benchdb.HistoryOperationInsertSeriesParams{
		Scope: client, Prefix: prefix, Amount: refundAmount, Count: int32(count),
	}); err != nil {
		return fmt.Errorf("insert the operations: %w", err)
	}
	if n != int64(count) {
		return fmt.Errorf("inserted %d operations of %d", n, count)
	}
	// Not through sqlc, like exec's CREATE DATABASE: VACUUM cannot run inside a
	// transaction block or a function, and the statement is a constant.
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) "+historyTables); err != nil {
		return fmt.Errorf("vacuum and analyze %s: %w", historyTables, err)
	}
	// The fill's WAL starts a checkpoint that would otherwise still be writing
	// while the timed operations run. CHECKPOINT needs a superuser (or, from
	// PostgreSQL 15, pg_checkpoint): without one, say so and go on.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(os.Stderr, "bench: history: no CHECKPOINT after the fill (%v); a checkpoint may run during the timed operations\n", err)
	}
	return nil
}
