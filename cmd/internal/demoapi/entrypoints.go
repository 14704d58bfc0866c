package demoapi

import (
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/workflows/refund"
)

// EntryPoints configures the demo's ways in beyond the clients' keyed
// requests: the provider's webhooks (POST /webhooks/provider), the queue of
// orders (POST /queue/orders, GET /queue/orders/{messageId}), and settlements
// (GET /settlements, and POST /admin/settlements behind Config.AdminToken),
// and the reconciliation's report (GET /admin/reconciliation, POST
// /admin/reconciliation/run, behind Config.AdminToken too).
type EntryPoints struct {
	// WebhookSecrets are the secrets the provider's webhooks may be signed
	// with, all accepted at once: the current one and, during a rotation, the
	// old one. Required.
	WebhookSecrets [][]byte
	// Queue is the River client that queued orders are inserted with: the
	// engine's (Engine.River), which runs their consumer (entry/riverjob's
	// worker, workflows/refund's OrderConsumer). Nil: no queue endpoints.
	Queue *river.Client[pgx.Tx]
	// QueueDuplicates is how many copies of every message the queue delivers
	// besides the message itself, at once, on purpose.
	QueueDuplicates int
	// WebhookHook, when set, is called in the transaction that records a
	// provider's event the first time (the demo's DEMO_CRASH at "confirm"),
	// with point "before" (before the demo's writes) and "after-effect"
	// (after them, before the commit), and the event's id.
	WebhookHook func(point, eventID string)
}

// entryPoints mounts the endpoints of Config.EntryPoints.
func (s *server) entryPoints() error {
	ep := s.cfg.EntryPoints
	if len(ep.WebhookSecrets) == 0 {
		return errors.New("demoapi: EntryPoints.WebhookSecrets is empty")
	}
	webhooks, err := s.webhooks(ep)
	if err != nil {
		return err
	}
	// The provider signs its webhooks: no bearer token.
	s.mux.Handle("POST /webhooks/provider", webhooks)
	paths := []string{"/webhooks/provider"}
	if ep.Queue != nil {
		if ep.QueueDuplicates < 0 {
			return errors.New("demoapi: EntryPoints.QueueDuplicates is negative")
		}
		s.mux.Handle("POST /queue/orders", s.authenticated(http.HandlerFunc(s.enqueueOrder)))
		s.mux.Handle("GET /queue/orders/{messageId}", s.authenticated(bounded(s.getQueueMessage)))
		paths = append(paths, "/queue/orders", "/queue/orders/{messageId}")
	}
	s.mux.Handle("GET /settlements", s.authenticated(bounded(s.listSettlements)))
	paths = append(paths, "/settlements")
	if s.cfg.AdminToken != "" {
		s.mux.Handle("POST /admin/settlements", s.adminOnly(sameOrigin(http.HandlerFunc(s.fireSettlements))))
		// Behind the token even for a wrong method, as all of /admin.
		s.mux.Handle("/admin/settlements", s.adminOnly(http.HandlerFunc(methodNotAllowed)))
		s.reconciliation()
	}
	for _, path := range paths {
		s.mux.HandleFunc(path, methodNotAllowed)
	}
	return nil
}

// ownsScope reports whether the operations of scope belong to client: those
// under its own keys, and those of its queued messages.
func ownsScope(client, scope string) bool {
	return scope == client || scope == refund.QueueScope(client)
}
