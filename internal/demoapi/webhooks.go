package demoapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/workflows/refund"
)

// WebhookScope is the engine scope of the provider's events: their ids are
// keys there. No client is named so (a client's name is its scope).
const WebhookScope = "webhook:provider"

// webhooks returns the handler of POST /webhooks/provider: entry/webhook's,
// which checks the signature and starts the provider event operation keyed
// by the event's id, once however often the provider delivers it.
func (s *server) webhooks(secrets [][]byte) (http.Handler, error) {
	h, err := webhook.Handler(s.cfg.Engine, s.cfg.Workflows.ProviderEvent, &webhook.Config[refund.ProviderEventInput]{
		Scope:     WebhookScope,
		Secrets:   secrets,
		EventFunc: decodeProviderEvent,
		Logger:    s.cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("demoapi: webhooks: %w", err)
	}
	return h, nil
}

// decodeProviderEvent reads a signed event of the provider about a refund: one
// it made (refund.succeeded) or a pending one it failed (refund.failed), whose
// data names the provider's refund id; events of other types are ignored (200,
// nothing recorded).
func decodeProviderEvent(_ *http.Request, body []byte) (webhook.Event, refund.ProviderEventInput, error) {
	var in refund.ProviderEventInput
	ev, err := webhook.ParseEvent(body)
	if err != nil {
		return ev, in, err
	}
	if ev.Type != refund.EventRefundSucceeded && ev.Type != refund.EventRefundFailed {
		return ev, in, webhook.ErrIgnore
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return ev, in, fmt.Errorf("the event is not a refund event: %s", jsonProblem(err))
	}
	d := in.Data
	switch {
	case d.RefundID == "":
		return ev, in, errors.New("data.refundId is required")
	case !eventText(d.RefundID) || len(d.RefundID) > maxIDLen:
		return ev, in, errors.New("data.refundId must be 1 to 255 bytes of text")
	case !eventText(d.OrderID) || len(d.OrderID) > maxIDLen:
		return ev, in, errors.New("data.orderId must be at most 255 bytes of text")
	case !eventText(d.IdempotencyKey) || len(d.IdempotencyKey) > maxIDLen:
		return ev, in, errors.New("data.idempotencyKey must be at most 255 bytes of text")
	case !eventText(in.Type):
		return ev, in, errors.New("type must be text")
	}
	return ev, in, nil
}

// eventText reports whether s is valid UTF-8 without control characters
// (PostgreSQL's text holds no NUL).
func eventText(s string) bool { return utf8.ValidString(s) && !hasControl(s) }

// jsonProblem says what encoding/json found wrong, in the body's terms.
func jsonProblem(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return typeErr.Field + " has the wrong type"
	}
	return "it is not the JSON of an event"
}
