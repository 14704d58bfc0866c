package main

// The demo's ways in beyond the clients' keyed requests (the README's "Beyond
// HTTP"): the provider's webhooks, the queue of orders, and settlements, each
// on its entry package (entry/webhook, entry/riverjob, entry/schedule).

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/demoapi"
	"github.com/idemflow/idemflow/internal/fakeprovider"
	"github.com/idemflow/idemflow/workflows/refund"
)

// defaultWebhookSecret is the secret of the provider's webhooks unless
// -webhook-secret says otherwise.
const defaultWebhookSecret = "demo-webhook-secret"

// webhookTimeout bounds a delivery of the fake provider's webhooks.
const webhookTimeout = 5 * time.Second

// entryCrashSteps are the steps of the entry points' operations that
// DEMO_CRASH, DEMO_PANIC and DEMO_FAIL may name: the provider event's confirm.
var entryCrashSteps = []string{refund.StepConfirm}

// entryConfig is the entry points' part of the configuration.
type entryConfig struct {
	// webhookSecrets are -webhook-secret's, comma-separated: the provider
	// signs with the first, the endpoint accepts any (a rotation).
	webhookSecrets [][]byte
	// webhookURL is where the fake provider sends its webhooks: -webhook-url,
	// by default this demo's own /webhooks/provider (none for "demo provider").
	webhookURL string
}

// entryFlags are the entry points' flags, as given.
type entryFlags struct {
	webhookSecret, webhookURL *string
}

// defineEntryFlags defines the entry points' flags on fs, with the defaults
// that env reads from the environment.
func defineEntryFlags(fs *flag.FlagSet, env func(key, def string) string) *entryFlags {
	return &entryFlags{
		webhookSecret: fs.String("webhook-secret", env("DEMO_WEBHOOK_SECRET", defaultWebhookSecret),
			"the secret the provider signs its webhooks with; several, comma-separated, are all accepted, and the provider signs with the first: a rotation (DEMO_WEBHOOK_SECRET)"),
		webhookURL: fs.String("webhook-url", env("DEMO_WEBHOOK_URL", ""),
			"where the fake provider sends its webhooks (DEMO_WEBHOOK_URL); default: this demo's /webhooks/provider, and none for demo provider"),
	}
}

// parse checks the entry points' flags.
func (f *entryFlags) parse(_ time.Duration) (entryConfig, error) {
	var c entryConfig
	for _, s := range strings.Split(*f.webhookSecret, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return c, errors.New("-webhook-secret: a secret is empty")
		}
		c.webhookSecrets = append(c.webhookSecrets, []byte(s))
	}
	c.webhookURL = strings.TrimSpace(*f.webhookURL)
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
func startEntryPoints(_ context.Context, cfg *config, _ *pgxpool.Pool, _ *engine.Engine, _ *refund.Workflows, _ *slog.Logger) (*demoapi.EntryPoints, func(), error) {
	return &demoapi.EntryPoints{WebhookSecrets: cfg.entry.webhookSecrets}, func() {}, nil
}
