package refund

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// The types of the provider's events that the demo acts on:
// EventRefundSucceeded for a refund it made (at once, or after it was
// pending), EventRefundFailed for a pending refund that it failed (it paid
// nothing).
const (
	EventRefundSucceeded = "refund.succeeded"
	EventRefundFailed    = "refund.failed"
)

// ProviderEventInput is a provider's webhook event, as its body says (and the
// input of the provider event operations started before the webhook endpoint
// recorded events itself). Every delivery of an event carries the same body
// (but its signature).
type ProviderEventInput struct {
	// ID is the provider's id of the event.
	ID   string `json:"id"`
	Type string `json:"type"`
	// Data is the provider's refund that the event is about.
	Data ProviderEventData `json:"data"`
}

// ProviderEventData is a refund as the provider's event tells it.
type ProviderEventData struct {
	// RefundID is the provider's id of the refund (pr_...).
	RefundID string `json:"refundId"`
	// IdempotencyKey is the key the refund was asked under: the refund
	// operation's derived key.
	IdempotencyKey string `json:"idempotencyKey"`
	OrderID        string `json:"orderId"`
	Amount         int64  `json:"amount"`
	// Status is the refund's status: "succeeded" or "failed".
	Status string `json:"status,omitempty"`
}

// ProviderEvent is a provider's webhook event as the demo's endpoint received
// it: what its body says, and a digest of each of the body's top-level fields.
type ProviderEvent struct {
	Input ProviderEventInput
	// BodyFields are EventBodyFields of the body: how a delivery again of the
	// event's id is told from another body under the same id.
	BodyFields map[string]string
}

// EventBodyFields returns, for each top-level field of body (a JSON object),
// the hex SHA-256 of its value, compacted: what ProviderEventRecord keeps of
// the body, so that an event id that comes again with another body is refused
// with the fields that differ.
func EventBodyFields(body []byte) (map[string]string, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, fmt.Errorf("refund: the event is not a JSON object: %w", err)
	}
	digests := make(map[string]string, len(fields))
	for name, raw := range fields {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return nil, fmt.Errorf("refund: the event's field %q: %w", name, err)
		}
		sum := sha256.Sum256(b.Bytes())
		digests[name] = hex.EncodeToString(sum[:])
	}
	return digests, nil
}

// EventOutcome is what a provider's event says of the refund it names, for
// the engine's inbox (Engine.RecordOutcome) under the refund's derived key:
// the refund's provider step applies it whenever it waits, whether the event
// came before or after (see the package documentation, "Late and unknown
// outcomes"). A success for the order and amount asked goes forward, even
// while the provider's lookup lags; a failure counts only when the lookup,
// asked then, does not contradict it.
func EventOutcome(in ProviderEventInput) engine.Outcome {
	o := engine.Outcome{EventID: in.ID, Record: reconcile.Record{
		Key: in.Data.IdempotencyKey, Reference: in.Data.RefundID, Amount: in.Data.Amount, Status: reconcile.Succeeded,
		Data: RecordData{OrderID: in.Data.OrderID},
	}}
	if in.Type == EventRefundFailed {
		o.Record.Status, o.Failure = reconcile.Failed, refundFailed()
	}
	return o
}

// RecordProviderEvent is the demo's writes about a provider's event, in tx,
// the transaction that keeps EventOutcome(ev.Input) in the engine's inbox
// (entry/webhook's OutcomeConfig.TxFunc; added is RecordOutcome's): it records
// the event (demo_provider_event, once per id) and confirms the refund it
// names, or keeps it for the refund's finalize step to apply when the refund
// has not got there yet (see the package documentation, "Webhooks").
//
// An event id recorded before with another body is refused with an
// *engine.ReusedError naming the top-level fields that differ, whatever
// key it names (the inbox is keyed by the key and the id): the caller rolls tx
// back. A new event is checked against the books, as a reconciliation run
// would (see checkRecord).
func (w *Workflows) RecordProviderEvent(ctx context.Context, tx pgx.Tx, ev ProviderEvent, added bool) error {
	in := ev.Input
	if in.Data.RefundID == "" {
		return engine.Fail(CodeInvalidRequest, "the event names no refund")
	}
	var fields []byte // NULL without digests
	if ev.BodyFields != nil {
		var err error
		if fields, err = json.Marshal(ev.BodyFields); err != nil {
			return fmt.Errorf("refund: record provider event %s: %w", in.ID, err)
		}
	}
	err := w.q.ProviderEventRecord(ctx, tx, refunddb.ProviderEventRecordParams{
		EventID:          in.ID,
		Type:             in.Type,
		ProviderRefundID: in.Data.RefundID,
		OrderID:          in.Data.OrderID,
		Amount:           in.Data.Amount,
		BodyFields:       fields,
	})
	if err != nil {
		return fmt.Errorf("refund: record provider event %s: %w", in.ID, err)
	}
	raw, err := w.q.ProviderEventBodyFields(ctx, tx, in.ID)
	if err != nil {
		return fmt.Errorf("refund: read provider event %s: %w", in.ID, err)
	}
	if raw != nil && fields != nil { // NULL: recorded by a provider_event operation, before
		var kept map[string]string
		if err := json.Unmarshal(raw, &kept); err != nil {
			return fmt.Errorf("refund: read provider event %s: %w", in.ID, err)
		}
		if differ := differingFields(kept, ev.BodyFields); len(differ) > 0 {
			return &engine.ReusedError{What: "event", ID: in.ID, Fields: differ}
		}
	}
	if !added {
		return nil // checked when it was new
	}
	return w.checkRecord(ctx, tx, in)
}

// differingFields returns the names of the fields that a and b do not hold
// alike, sorted.
func differingFields(a, b map[string]string) []string {
	var differ []string
	for name, v := range a {
		if w, ok := b[name]; !ok || w != v {
			differ = append(differ, name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			differ = append(differ, name)
		}
	}
	slices.Sort(differ)
	return differ
}

// checkRecord checks the event's refund against the refund operation that
// holds its key, as a reconciliation run would, in the event's transaction:
// a refund the provider made for a refund whose operation failed, or for
// another order or amount, is a mismatch at once (see Workflows.Bind). Without
// an engine, or with one whose reconciliation has no provider source, the
// next run finds it instead.
func (w *Workflows) checkRecord(ctx context.Context, tx pgx.Tx, in ProviderEventInput) error {
	e := w.engine.Load()
	if e == nil || in.Data.IdempotencyKey == "" {
		return nil
	}
	status := reconcile.Succeeded
	if in.Type == EventRefundFailed {
		status = reconcile.Failed
	}
	_, err := e.CheckRecord(ctx, tx, ProviderSource, reconcile.Record{
		Key: in.Data.IdempotencyKey, Reference: in.Data.RefundID, Amount: in.Data.Amount, Status: status,
		Data: RecordData{OrderID: in.Data.OrderID},
	})
	if errors.Is(err, engine.ErrUnknownSource) {
		return nil
	}
	return err
}
