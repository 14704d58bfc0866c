package main

// The demo's ways in beyond the clients' keyed requests (docs/guide/define.md's
// "Beyond HTTP"): the provider's webhooks, the queue of orders, and settlements, each
// on its entry package (entry/webhook, entry/riverjob, entry/schedule).

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/cmd/internal/demoapi"
	"github.com/idemflow/idemflow/cmd/internal/fakeprovider"
	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/entry/schedule"
	"github.com/idemflow/idemflow/workflows/refund"
)

// defaultWebhookSecret is the secret of the provider's webhooks unless
// -webhook-secret says otherwise.
const defaultWebhookSecret = "demo-webhook-secret"

// webhookTimeout bounds a delivery of the fake provider's webhooks.
const webhookTimeout = 5 * time.Second

// stepConsume names the queue consumer's work for DEMO_CRASH, DEMO_PANIC and
// DEMO_FAIL: a job's delivery of a queued order, in the transaction that
// starts its operation and completes the job. "before" is before that
// transaction; "after-effect" is after the operation's start, before the
// commit. An attempt is the job's (River's).
const stepConsume = "consume"

// entryCrashSteps are the steps of the entry points that DEMO_CRASH,
// DEMO_PANIC and DEMO_FAIL may name: the provider event's confirm, the
// queue's consume, and the settlement's settle. DEMO_CRASH at confirm is in
// the webhook's transaction that records an event the first time ("before":
// before the demo's writes; "after-effect": after them, before the commit);
// DEMO_PANIC and DEMO_FAIL at confirm reach only the provider_event
// operations started before the endpoint recorded events itself (see
// refund.ProviderEventOperation), whose step it is.
var entryCrashSteps = []string{refund.StepConfirm, stepConsume, refund.StepSettle}

// orderQueueWorkers is how many queued orders a process consumes at once.
const orderQueueWorkers = 10

// maxQueueDuplicates bounds -queue-duplicates.
const maxQueueDuplicates = 100

// entryConfig is the entry points' part of the configuration.
type entryConfig struct {
	// webhookSecrets are -webhook-secret's, comma-separated: the provider
	// signs with the first, the endpoint accepts any (a rotation).
	webhookSecrets [][]byte
	// webhookURL is where the fake provider sends its webhooks: -webhook-url,
	// by default this demo's own /webhooks/provider (none for "demo provider").
	webhookURL string
	// queueDuplicates is -queue-duplicates: the extra copies of every queued
	// message.
	queueDuplicates int
	// settlementInterval is -settlement-interval: the period of the
	// settlements every process fires; 0 fires none (POST /admin/settlements
	// still does).
	settlementInterval time.Duration
}

// entryFlags are the entry points' flags, as given.
type entryFlags struct {
	webhookSecret, webhookURL, queueDuplicates, settlementInterval *string
}

// defineEntryFlags defines the entry points' flags on fs, with the defaults
// that env reads from the environment.
func defineEntryFlags(fs *flag.FlagSet, env func(key, def string) string) *entryFlags {
	return &entryFlags{
		webhookSecret: fs.String("webhook-secret", env("DEMO_WEBHOOK_SECRET", defaultWebhookSecret),
			"the secret the provider signs its webhooks with; several, comma-separated, are all accepted, and the provider signs with the first: a rotation (DEMO_WEBHOOK_SECRET)"),
		webhookURL: fs.String("webhook-url", env("DEMO_WEBHOOK_URL", ""),
			"where the fake provider sends its webhooks (DEMO_WEBHOOK_URL); default: this demo's /webhooks/provider, and none for demo provider"),
		queueDuplicates: fs.String("queue-duplicates", env("DEMO_QUEUE_DUPLICATES", "0"),
			"how many extra copies of every queued message the queue delivers, at once (DEMO_QUEUE_DUPLICATES)"),
		settlementInterval: fs.String("settlement-interval", env("DEMO_SETTLEMENT_INTERVAL", "0"),
			"how often every process settles each client's merchant balance, whole seconds; 0: never on its own (DEMO_SETTLEMENT_INTERVAL)"),
	}
}

// parse checks the entry points' flags; retention is -retention's, which the
// settlements' slots must fit twice (see entry/schedule, "Retention").
func (f *entryFlags) parse(retention time.Duration) (entryConfig, error) {
	var c entryConfig
	for _, s := range strings.Split(*f.webhookSecret, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return c, errors.New("-webhook-secret: a secret is empty")
		}
		c.webhookSecrets = append(c.webhookSecrets, []byte(s))
	}
	c.webhookURL = strings.TrimSpace(*f.webhookURL)
	n, err := strconv.Atoi(strings.TrimSpace(*f.queueDuplicates))
	if err != nil || n < 0 || n > maxQueueDuplicates {
		return c, fmt.Errorf("-queue-duplicates: %q is not an integer from 0 to %d", *f.queueDuplicates, maxQueueDuplicates)
	}
	c.queueDuplicates = n
	if s := strings.TrimSpace(*f.settlementInterval); s != "0" {
		d, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return c, fmt.Errorf("-settlement-interval: %w", err)
		case d < time.Second || d%time.Second != 0:
			return c, fmt.Errorf("-settlement-interval: %s is not 0 or a positive whole number of seconds", s)
		case d*schedule.MinRetentionPeriods > retention:
			return c, fmt.Errorf("-settlement-interval: %s is more than half of -retention (%s): a slot's key would be deleted while the slot could still be fired", s, retention)
		}
		c.settlementInterval = d
	}
	return c, nil
}

// providerConfig is the fake provider's configuration: its webhooks go to
// -webhook-url, else to demoBase's /webhooks/provider (none when both are
// empty), signed with the first -webhook-secret.
func providerConfig(cfg *config, demoBase string, logger *slog.Logger) *fakeprovider.Config {
	c := &fakeprovider.Config{Logger: logger, WebhookURL: cfg.entry.webhookURL}
	if c.WebhookURL == "" && demoBase != "" {
		c.WebhookURL = demoBase + "/webhooks/provider"
	}
	if c.WebhookURL != "" {
		c.WebhookSecret = cfg.entry.webhookSecrets[0]
		// The demo's endpoint answers once the event's key is reserved, in
		// milliseconds; a slower delivery is cut and sent again, and an event
		// that a dead process was sending is due again 6 s after it took it.
		c.WebhookTimeout = webhookTimeout
	}
	return c
}

// runWebhooks runs the fake provider's webhook sender until ctx ends or the
// returned function is called, which waits for it to return.
func runWebhooks(ctx context.Context, p *fakeprovider.Server) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.RunWebhooks(ctx) })
	return func() {
		cancel()
		wg.Wait()
	}
}

// startEntryPoints starts what the entry points run in the background, and
// returns the API's part of them and a function that stops the rest.
func startEntryPoints(ctx context.Context, cfg *config, e *engine.Engine, wf *refund.Workflows, logger *slog.Logger) (*demoapi.EntryPoints, func(), error) {
	ep := &demoapi.EntryPoints{
		WebhookSecrets:  cfg.entry.webhookSecrets,
		Queue:           e.River(),
		QueueDuplicates: cfg.entry.queueDuplicates,
	}
	if crash := cfg.crash; crash != nil && crash.step == refund.StepConfirm {
		ep.WebhookHook = func(point, eventID string) {
			if point == crash.point {
				crashNow(refund.StepConfirm, point, "provider event "+eventID)
			}
		}
	}
	if cfg.entry.settlementInterval == 0 {
		return ep, func() {}, nil
	}
	clients := make([]string, len(cfg.clients))
	for i, c := range cfg.clients {
		clients[i] = c.name
	}
	runner, err := schedule.New(e, wf.Settlement, &schedule.Config[refund.SettlementInput]{
		Period:     cfg.entry.settlementInterval,
		ScopesFunc: func(context.Context, time.Time) ([]string, error) { return clients, nil },
		InputFunc: func(client string, slot time.Time) refund.SettlementInput {
			return refund.SettlementInput{Client: client, Slot: slot}
		},
		Logger: logger,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("settlements: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = runner.Run(ctx) })
	return ep, func() {
		cancel()
		wg.Wait()
	}, nil
}

// orderConsumer is the queue's consumer: entry/riverjob's worker of the queued
// orders, on the engine's own River client (engine.RiverConfig.Workers), so
// that River's leader, whichever process it is, knows the jobs' kind and
// retries a stuck one rather than discard it.
type orderConsumer struct {
	cfg *config
	wf  *refund.Workflows
}

func newOrderConsumer(cfg *config, wf *refund.Workflows) *orderConsumer {
	return &orderConsumer{cfg: cfg, wf: wf}
}

// addWorker is engine.RiverConfig.Workers: riverjob's worker, made on the
// engine being made.
func (c *orderConsumer) addWorker(e *engine.Engine, workers *river.Workers) error {
	w, err := riverjob.New(e, c.wf.Order, c.config())
	if err != nil {
		return fmt.Errorf("the queue's consumer: %w", err)
	}
	return river.AddWorkerSafely(workers, w)
}

// queues is engine.RiverConfig.Queues.
func (c *orderConsumer) queues() map[string]river.QueueConfig {
	return map[string]river.QueueConfig{refund.OrderQueue: {MaxWorkers: orderQueueWorkers}}
}

// config is workflows/refund's consumer configuration with the demo's fault
// injection at stepConsume.
func (c *orderConsumer) config() *riverjob.Config[refund.QueueOrderArgs, refund.OrderInput] {
	rc := c.wf.OrderConsumer()
	crash, panics, fails := c.cfg.crash, c.cfg.panics, c.cfg.fails
	at := func(point string, job *river.Job[refund.QueueOrderArgs]) bool {
		return crash != nil && crash.step == stepConsume && crash.point == point && job.Attempt == 1
	}
	message, started := rc.MessageFunc, rc.StartedFunc
	rc.MessageFunc = func(job *river.Job[refund.QueueOrderArgs]) (riverjob.Message[refund.OrderInput], error) {
		if panics != nil && panics.step == stepConsume && job.Attempt <= panics.n {
			panic(fmt.Sprintf("DEMO_PANIC: injected panic in attempt %d of %s", job.Attempt, stepConsume))
		}
		if fails != nil && fails.step == stepConsume && job.Attempt <= fails.n {
			return riverjob.Message[refund.OrderInput]{}, errInjected
		}
		if at("before", job) {
			crashNow(stepConsume, "before", fmt.Sprintf("message %s", job.Args.MessageID))
		}
		return message(job)
	}
	rc.StartedFunc = func(ctx context.Context, tx pgx.Tx, job *river.Job[refund.QueueOrderArgs], s *engine.Started) error {
		if err := started(ctx, tx, job, s); err != nil {
			return err
		}
		if at("after-effect", job) {
			crashNow(stepConsume, "after-effect", fmt.Sprintf("message %s (operation %s reserved, not committed)", job.Args.MessageID, s.ID))
		}
		return nil
	}
	return rc
}

// crashNow is DEMO_CRASH's exit, outside the engine's hook.
func crashNow(step, point, what string) {
	fmt.Fprintf(os.Stderr, "DEMO_CRASH: exiting with status %d at %s:%s of %s\n", crashExitCode, step, point, what)
	os.Exit(crashExitCode)
}
