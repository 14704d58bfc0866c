package demoapi

import (
	"errors"
)

// EntryPoints configures the demo's ways in beyond the clients' keyed
// requests: the provider's webhooks (POST /webhooks/provider).
type EntryPoints struct {
	// WebhookSecrets are the secrets the provider's webhooks may be signed
	// with, all accepted at once: the current one and, during a rotation, the
	// old one. Required.
	WebhookSecrets [][]byte
}

// entryPoints mounts the endpoints of Config.EntryPoints.
func (s *server) entryPoints() error {
	ep := s.cfg.EntryPoints
	if len(ep.WebhookSecrets) == 0 {
		return errors.New("demoapi: EntryPoints.WebhookSecrets is empty")
	}
	webhooks, err := s.webhooks(ep.WebhookSecrets)
	if err != nil {
		return err
	}
	// The provider signs its webhooks: no bearer token.
	s.mux.Handle("POST /webhooks/provider", webhooks)
	for _, path := range []string{"/webhooks/provider"} {
		s.mux.HandleFunc(path, methodNotAllowed)
	}
	return nil
}
