package demoapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/webhook"
	"github.com/idemflow/idemflow/workflows/refund"
)

// webhooks returns the handler of POST /webhooks/provider: entry/webhook's
// Outcomes, which checks the signature and keeps what the event says of the
// refund in the engine's inbox under the refund's derived key, for its
// provider step whenever it waits, with the demo's own record of the event
// (refund.Workflows.RecordProviderEvent) in the same transaction: once,
// however often the provider delivers it.
func (s *server) webhooks(ep *EntryPoints) (http.Handler, error) {
	wf, hook := s.cfg.Workflows, ep.WebhookHook
	h, err := webhook.Outcomes(s.cfg.Engine, &webhook.OutcomeConfig{
		OutcomeFunc: func(r *http.Request, body []byte) (engine.Outcome, error) {
			ev, err := decodeProviderEvent(body)
			if err != nil {
				return engine.Outcome{}, err
			}
			slot, ok := r.Context().Value(eventSlotKey{}).(*refund.ProviderEvent)
			if !ok {
				return engine.Outcome{}, errors.New("demoapi: the webhook's request has no event slot")
			}
			*slot = ev
			return refund.EventOutcome(ev.Input), nil
		},
		TxFunc: func(ctx context.Context, tx pgx.Tx, o engine.Outcome, added bool) error {
			ev, ok := ctx.Value(eventSlotKey{}).(*refund.ProviderEvent)
			if !ok || ev.Input.ID != o.EventID {
				return errors.New("demoapi: the webhook's event is not the outcome's")
			}
			if hook != nil && added {
				hook("before", o.EventID)
			}
			if err := wf.RecordProviderEvent(ctx, tx, *ev, added); err != nil {
				return err
			}
			if hook != nil && added {
				hook("after-effect", o.EventID)
			}
			return nil
		},
		Secrets: ep.WebhookSecrets,
		Logger:  s.cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("demoapi: webhooks: %w", err)
	}
	// The outcome does not carry the body, which TxFunc compares with the
	// one kept under the event's id: OutcomeFunc leaves the event it read in
	// a slot of the request's context, which TxFunc's context derives from.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), eventSlotKey{}, new(refund.ProviderEvent))))
	}), nil
}

// eventSlotKey is the context key of the *refund.ProviderEvent that the
// webhook's OutcomeFunc read, for its TxFunc.
type eventSlotKey struct{}

// decodeProviderEvent reads a signed event of the provider about a refund: one
// it made (refund.succeeded) or a pending one it failed (refund.failed), whose
// data names the provider's refund id and the key it was asked under; events
// of other types are ignored (200, nothing recorded).
func decodeProviderEvent(body []byte) (refund.ProviderEvent, error) {
	var in refund.ProviderEventInput
	ev, err := webhook.ParseEvent(body)
	if err != nil {
		return refund.ProviderEvent{}, err
	}
	if ev.Type != refund.EventRefundSucceeded && ev.Type != refund.EventRefundFailed {
		return refund.ProviderEvent{}, webhook.ErrIgnore
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return refund.ProviderEvent{}, fmt.Errorf("the event is not a refund event: %s", jsonProblem(err))
	}
	d := in.Data
	switch {
	case d.RefundID == "":
		return refund.ProviderEvent{}, errors.New("data.refundId is required")
	case !eventText(d.RefundID) || len(d.RefundID) > maxIDLen:
		return refund.ProviderEvent{}, errors.New("data.refundId must be 1 to 255 bytes of text")
	case !eventText(d.OrderID) || len(d.OrderID) > maxIDLen:
		return refund.ProviderEvent{}, errors.New("data.orderId must be at most 255 bytes of text")
	case d.IdempotencyKey == "":
		return refund.ProviderEvent{}, errors.New("data.idempotencyKey is required")
	case !eventText(d.IdempotencyKey) || len(d.IdempotencyKey) > maxIDLen:
		return refund.ProviderEvent{}, errors.New("data.idempotencyKey must be at most 255 bytes of text")
	case !eventText(in.Type):
		return refund.ProviderEvent{}, errors.New("type must be text")
	}
	fields, err := refund.EventBodyFields(body)
	if err != nil {
		return refund.ProviderEvent{}, errors.New("it is not the JSON of an event")
	}
	return refund.ProviderEvent{Input: in, BodyFields: fields}, nil
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
