// Command demo is a refund API built on idemflow, with a fake payment provider, a
// double-entry ledger, and fault and crash injection. Its HTTP contract is
// docs/demo-api.md; docs/demo.md walks through it.
//
// Usage:
//
//	demo [flags]             serve the API (and the fake provider under /provider),
//	                         the operators' pages at /ops and River UI at /riverui/
//	demo provider [flags]    serve the fake provider alone
//	demo ops [flags] list|retry|cancel|approve|reject ...   an operator's view:
//	                         list operations by status, retry a failed one,
//	                         cancel a stuck one, approve or reject a refund
//	                         that waits for approval
//	demo db stop [-data-dir]  stop the private PostgreSQL cluster, as one that a
//	                         killed demo left running (a demo that exits stops
//	                         only the cluster it started)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"riverqueue.com/riverui"

	"github.com/idemflow/idemflow/cmd/internal/demoapi"
	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/contrib/idemflowotel"
	"github.com/idemflow/idemflow/contrib/idemflowprom"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/pgcluster"
	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/workflows/refund"
)

// shutdownTimeout bounds how long a stopping demo lets running steps finish.
const shutdownTimeout = 10 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	name, serve := "demo", serveAPI
	if len(args) > 0 && args[0] == "ops" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return runOps(ctx, args[1:], getenv, stdout, stderr, logger)
	}
	if len(args) > 0 && args[0] == "db" {
		return runDB(args[1:], getenv, stdout, stderr, logger)
	}
	if len(args) > 0 && args[0] == "provider" {
		name, serve, args = "demo provider", serveProvider, args[1:]
	}
	cfg, err := parseConfig(name, args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, logger, stdout); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

const dbUsage = `usage: demo db [-data-dir DIR] stop   (stops the private PostgreSQL cluster that the demo left running)`

// runDB is "demo db [flags] stop": it stops the private cluster in
// -data-dir, if one runs there.
func runDB(args []string, getenv func(string) string, stdout, stderr io.Writer, logger *slog.Logger) int {
	// The flags may come before or after the command.
	flagArgs, stop := args, false
	if i := slices.Index(args, "stop"); i >= 0 {
		flagArgs, stop = slices.Delete(slices.Clone(args), i, i+1), true
	}
	cfg, err := parseConfig("demo db", flagArgs, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, dbUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo db: %v\n%s\n", err, dbUsage)
		return 2
	}
	if !stop {
		fmt.Fprintln(stderr, dbUsage)
		return 2
	}
	stopped, err := pgcluster.Stop(context.Background(), &pgcluster.Config{DataDir: cfg.dataDir, Logger: logger})
	if err != nil {
		fmt.Fprintf(stderr, "demo db stop: %v\n", err)
		return 1
	}
	if stopped {
		fmt.Fprintf(stdout, "stopped the PostgreSQL cluster in %s\n", cfg.dataDir)
	} else {
		fmt.Fprintf(stdout, "no PostgreSQL cluster runs in %s\n", cfg.dataDir)
	}
	return 0
}

// serveAPI runs the refund API until ctx ends, then drains it.
func serveAPI(ctx context.Context, cfg *config, logger *slog.Logger, stdout io.Writer) error {
	fmt.Fprintln(stdout, "API clients (Authorization: Bearer <token>):")
	for _, c := range cfg.clients {
		fmt.Fprintf(stdout, "  %s  %s\n", c.name, c.token)
	}
	fmt.Fprintln(stdout, "Operators (/ops, /riverui/, /admin; HTTP Basic with any user name and the token as password, or Authorization: Bearer <token>):")
	fmt.Fprintf(stdout, "  admin token  %s\n", cfg.adminToken)
	pool, stopDB, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopDB(context.WithoutCancel(ctx))
	defer pool.Close()
	if err := migrate(ctx, pool, logger); err != nil {
		return err
	}
	control, err := openControlPool(ctx, pool, cfg)
	if err != nil {
		return err
	}
	defer control.Close()

	// The listener comes first: the default provider URL is this server's own.
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	defer ln.Close()
	providerURL := cfg.providerURL
	var providerHandler http.Handler
	if providerURL == "" {
		p, err := fakeprovider.New(pool, providerConfig(cfg, "http://"+ln.Addr().String(), logger))
		if err != nil {
			return err
		}
		defer runWebhooks(ctx, p)()
		if cfg.providerAddr == "" {
			providerURL = "http://" + ln.Addr().String() + "/provider"
			providerHandler = p.Handler()
		} else {
			// On a listener of its own: a real deployment never exposes its
			// provider's fake on the API's.
			pln, err := net.Listen("tcp", cfg.providerAddr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", cfg.providerAddr, err)
			}
			defer pln.Close()
			providerURL = "http://" + pln.Addr().String()
			limit := demoapi.DefaultMaxConns() / 4
			psrv := demoapi.NewHTTPServer(p.Handler(), cfg.wait, 0, demoapi.NewConnLimiter(limit, limit))
			go func() { _ = psrv.Serve(demoapi.JSONErrors(pln)) }()
			defer psrv.Close()
			fmt.Fprintf(stdout, "fake payment provider listening on %s\n", providerURL)
		}
	}
	tp, stopTraces, err := tracing(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = stopTraces(context.WithoutCancel(ctx)) }()
	providerClient := &refund.ProviderClient{BaseURL: providerURL, HTTP: providerHTTP(cfg)}
	if tp != nil {
		providerClient.HTTP.Transport = idemflowotel.Transport(tp, providerClient.HTTP.Transport)
	}
	wf, err := refund.New(providerClient, refundConfig(cfg))
	if err != nil {
		return err
	}
	metrics, err := idemflowprom.New(prometheus.DefaultRegisterer, &idemflowprom.Opts{GaugeInterval: min(cfg.lease, 5*time.Second), Logger: logger})
	if err != nil {
		return err
	}
	metrics.Declare(wf.Operations()...)
	consumer := newOrderConsumer(cfg, wf)
	e, err := engine.New(pool, &engine.Config{
		Operations: wf.Operations(),
		Observer:   engine.Observers(metrics.Observer(), idemflowotel.Observer(tp, nil)),

		Logger:            logger,
		Lease:             cfg.lease,
		Retention:         cfg.retention,
		RetentionInterval: min(cfg.retention, time.Minute),
		Faults:            engine.Faults{Hook: faultHook(cfg), GroupSenders: cfg.groupSenders},
		ControlPool:       control,
		// Through a pooler: River polls, and the liveness lock is held on the
		// direct connection, if any.
		Pooler:      cfg.pooler,
		Takeover:    engine.TakeoverConfig{ConnConfig: cfg.direct},
		MaxInFlight: cfg.maxInFlight,
		// A client over its share gets 429; the others keep theirs.
		MaxInFlightPerScope: cfg.perClient,
		River: engine.RiverConfig{
			Middleware: idemflowotel.RiverMiddleware(tp),
			// The queue's consumer, on the engine's River client.
			Workers: consumer.addWorker,
			Queues:  consumer.queues(),
			// A delivery cut by a crash is delivered again after this, not
			// River's hour: riverjob's consumer, and the engine's jobs, are
			// safe to run twice.
			RescueStuckJobsAfter: max(2*cfg.lease, 10*time.Second),
		},
		Reconcile: reconcileConfig(cfg, providerURL),
	})
	if err != nil {
		return err
	}
	// Provider events settle the refunds that wait for them.
	wf.Bind(e)
	if err := e.StartWorkers(ctx); err != nil {
		return err
	}
	gaugeCtx, stopGauges := context.WithCancel(ctx)
	defer stopGauges()
	go metrics.Run(gaugeCtx, e)
	entry, stopEntry, err := startEntryPoints(ctx, cfg, e, wf, logger)
	if err != nil {
		return err
	}
	defer stopEntry()
	riverUI, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(e.River(), nil),
		Logger:    logger,
		Prefix:    "/riverui",
	})
	if err != nil {
		return fmt.Errorf("river ui: %w", err)
	}
	if err := riverUI.Start(ctx); err != nil {
		return fmt.Errorf("river ui: %w", err)
	}
	srv, err := demoapi.New(&demoapi.Config{
		Pool: pool, Engine: e, Workflows: wf, Clients: apiClients(cfg.clients),
		Wait: cfg.wait, Provider: providerHandler, Logger: logger,
		Metrics: promhttp.Handler(), ObserveRequest: metrics.ObserveRequest,
		AdminToken: cfg.adminToken, RiverUI: riverUI, EntryPoints: entry,
	})
	if err != nil {
		return err
	}
	limit := demoapi.DefaultMaxConns()
	httpServer := demoapi.NewHTTPServer(idemflowotel.Handler(tp, srv), cfg.wait, idempotency.DefaultReserveTimeout, demoapi.NewConnLimiter(limit, max(limit/4, 64)))
	httpServer.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpServer.Serve(demoapi.JSONErrors(ln)) }()
	fmt.Fprintf(stdout, "idemflow demo listening on http://%s\n", ln.Addr())

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("stopping: draining requests and running steps")
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := httpServer.Shutdown(drainCtx); err != nil {
		logger.Warn("requests still running at shutdown", slog.String("error", err.Error()))
	}
	if err := e.Stop(drainCtx); err != nil {
		logger.Warn("operations still running at shutdown resume after restart", slog.String("error", err.Error()))
	}
	return nil
}

// serveProvider runs the fake payment provider alone, at / and under /provider.
func serveProvider(ctx context.Context, cfg *config, logger *slog.Logger, stdout io.Writer) error {
	pool, stopDB, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopDB(context.WithoutCancel(ctx))
	defer pool.Close()
	if err := fakeprovider.Migrate(ctx, pool); err != nil {
		return err
	}
	p, err := fakeprovider.New(pool, providerConfig(cfg, "", logger))
	if err != nil {
		return err
	}
	defer runWebhooks(ctx, p)()
	mux := http.NewServeMux()
	mux.Handle("/provider/", http.StripPrefix("/provider", p.Handler()))
	mux.Handle("/", p.Handler())
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	limit := demoapi.DefaultMaxConns()
	httpServer := demoapi.NewHTTPServer(mux, 0, 0, demoapi.NewConnLimiter(limit, max(limit/4, 64)))
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpServer.Serve(demoapi.JSONErrors(ln)) }()
	fmt.Fprintf(stdout, "fake payment provider listening on http://%s\n", ln.Addr())
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	drainCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	return httpServer.Shutdown(drainCtx)
}

// migrate applies the engine's and River's migrations, the demo's ledger and the
// provider's schema. Each set takes its own lock, so concurrent starts are safe.
func migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	if err := engine.Migrate(ctx, pool, &engine.MigrateOpts{Logger: logger}); err != nil {
		return err
	}
	if err := refund.Migrate(ctx, pool); err != nil {
		return err
	}
	return fakeprovider.Migrate(ctx, pool)
}

// refundConfig is the refund operations' configuration from the demo's flags.
func refundConfig(cfg *config) *refund.Config {
	return &refund.Config{Retry: retryPolicy(cfg), RefundVersions: cfg.versions, ProviderSettle: cfg.providerSettle,
		ProviderTimeout: cfg.providerTimeout, ApprovalThreshold: cfg.approvalThreshold, Approvals: cfg.approvals,
		ApprovalTimeout: cfg.approvalTimeout}
}

// providerHTTP is the provider client's HTTP, made once per process so that
// its connections are kept: refund.DefaultProviderHTTP's transport, with each
// request bounded by -provider-timeout.
func providerHTTP(cfg *config) *http.Client {
	t := refund.DefaultProviderHTTP.Transport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = cfg.providerTimeout
	return &http.Client{Transport: t, Timeout: cfg.providerTimeout}
}

// retryPolicy is the demo's retry policy: the backoff from -retry-backoff, its
// cap ten times that (at most 5 minutes), -max-attempts attempts. A step that
// keeps failing after the provider refunded is retried at the cap for as long
// as it takes.
func retryPolicy(cfg *config) engine.RetryPolicy {
	return engine.RetryPolicy{
		Base:        cfg.retryBackoff,
		Cap:         min(10*cfg.retryBackoff, 5*time.Minute), // the engine's default cap
		MaxAttempts: cfg.maxAttempts,
	}
}

// errInjected is the transient error of DEMO_FAIL.
var errInjected = errors.New("DEMO_FAIL: injected transient failure")

// faultHook returns the engine hook of the demo's fault injection: DEMO_CRASH
// makes the process exit at once with status 86, with no cleanup, at the chosen
// point of the first run of a step; DEMO_PANIC and DEMO_FAIL make the first n
// attempts of a step, in every operation and process, panic or fail before they
// do anything.
func faultHook(cfg *config) faults.Hook {
	at, panics, fails := cfg.crash, cfg.panics, cfg.fails
	if at == nil && panics == nil && fails == nil {
		return nil
	}
	return func(ctx context.Context, ev faults.Event) error {
		if ev.Point == faults.PointBefore {
			if panics != nil && ev.Step == panics.step && ev.Attempt <= panics.n {
				panic(fmt.Sprintf("DEMO_PANIC: injected panic in attempt %d of step %s", ev.Attempt, ev.Step))
			}
			if fails != nil && ev.Step == fails.step && ev.Attempt <= fails.n {
				return errInjected
			}
		}
		if at != nil && !ev.Resumed && ev.Attempt == 1 && ev.Step == at.step && string(ev.Point) == at.point {
			fmt.Fprintf(os.Stderr, "DEMO_CRASH: exiting with status %d at %s:%s of operation %s\n", crashExitCode, at.step, at.point, ev.OperationID)
			os.Exit(crashExitCode)
		}
		return nil
	}
}

// reconcileConfig checks the books against the provider at providerURL every
// -reconcile-interval (never when 0: only on request), within
// -reconcile-window. Its list has a client of its own: -provider-timeout bounds
// the refunds' calls, not a page of the list.
func reconcileConfig(cfg *config, providerURL string) reconcile.Config {
	interval := cfg.reconcileInterval
	if interval == 0 {
		interval = -1
	}
	return reconcile.Config{
		Sources:  []reconcile.Source{refund.Source(&refund.ProviderClient{BaseURL: providerURL})},
		Interval: interval,
		Window:   cfg.reconcileWindow,
	}
}
