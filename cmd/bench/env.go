package main

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund"
)

// stopTimeout bounds how long a mode's engine and servers take to stop.
const stopTimeout = 30 * time.Second

// env is what one mode runs on: a pool for the application (the engine, the
// steps, River; or the baseline) and one for the provider, each with its
// counter, the provider, and, but for the baseline, the engine.
type env struct {
	app, prov           *pgxpool.Pool
	appCount, provCount *counter
	// provider calls the fake provider's handler in memory.
	provider *refund.ProviderClient
	wf       *refund.Workflows
	eng      *engine.Engine
	// closers run first when the env closes, last added first.
	closers []func(context.Context)
	logger  *slog.Logger
	closed  sync.Once
}

// newEnv opens a mode's pools and provider and, withEngine, its engine, whose
// River workers (retries, resumes, the sweeper) run when workers is set.
func (b *bench) newEnv(ctx context.Context, withEngine, workers bool, obs ...*engine.Observer) (*env, error) {
	cfg := envConfig{conns: b.opts.c, withEngine: withEngine, workers: workers}
	if len(obs) > 0 {
		cfg.engine = func(c *engine.Config) { c.Observer = obs[0] }
	}
	return b.newEnvWith(ctx, cfg)
}

// envConfig is what newEnvWith opens.
type envConfig struct {
	// conns is how many operations may be in flight at once.
	conns int
	// withEngine opens an engine, whose River workers run when workers is set.
	withEngine, workers bool
	// pooled connects the pools through modePooled's PgBouncer, and runs the
	// engine with Config.Pooler.
	pooled bool
	// providerLatency delays every call to the provider (0: none).
	providerLatency time.Duration
	// engine, when not nil, changes the engine's Config.
	engine func(*engine.Config)
}

// newEnvWith opens an env as cfg says.
func (b *bench) newEnvWith(ctx context.Context, cfg envConfig) (_ *env, err error) {
	e := &env{appCount: &counter{}, provCount: &counter{}, logger: b.quiet}
	defer func() {
		if err != nil {
			e.close(ctx)
		}
	}()
	// Every operation in flight holds at most one connection of each pool; the
	// spare ones are River's (its notifier holds one) and the lease renewals'.
	dbConfig := b.srv.dbConfig
	if cfg.pooled {
		dbConfig = b.pooled
	}
	if e.app, err = b.srv.poolOf(ctx, dbConfig, cfg.conns+10, e.appCount); err != nil {
		return e, err
	}
	if e.prov, err = b.srv.poolOf(ctx, dbConfig, cfg.conns+2, e.provCount); err != nil {
		return e, err
	}
	p, err := fakeprovider.New(e.prov, &fakeprovider.Config{Logger: b.quiet})
	if err != nil {
		return e, err
	}
	e.provider = &refund.ProviderClient{
		BaseURL: "http://provider.bench",
		HTTP:    &http.Client{Transport: handlerTransport{h: p.Handler(), delay: cfg.providerLatency}, Timeout: refund.DefaultProviderTimeout},
	}
	if !cfg.withEngine {
		return e, nil
	}
	if e.wf, err = refund.New(e.provider, nil); err != nil {
		return e, err
	}
	ecfg := &engine.Config{Operations: e.wf.Operations(), Logger: b.quiet, Pooler: cfg.pooled}
	if cfg.engine != nil {
		cfg.engine(ecfg)
	}
	ecfg.Observer = engine.Observers(ecfg.Observer, &engine.Observer{CommitGrouped: e.appCount.commitGrouped})
	if e.eng, err = engine.New(e.app, ecfg); err != nil {
		return e, err
	}
	if cfg.workers {
		if err := e.eng.StartWorkers(ctx); err != nil {
			return e, err
		}
	}
	return e, nil
}

// close stops what runs on the env and closes its pools, whose backends then
// exit and publish their statistics. Calls after the first do nothing.
func (e *env) close(ctx context.Context) {
	e.closed.Do(func() { e.stop(ctx) })
}

func (e *env) stop(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	for _, f := range slices.Backward(e.closers) {
		f(ctx)
	}
	if e.eng != nil {
		if err := e.eng.Stop(ctx); err != nil {
			e.logger.WarnContext(ctx, "could not stop the engine", slog.String("error", err.Error()))
		}
	}
	if e.app != nil {
		e.app.Close()
	}
	if e.prov != nil {
		e.prov.Close()
	}
}
