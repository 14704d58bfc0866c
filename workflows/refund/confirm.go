package refund

import (
	"context"
	"fmt"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// ProviderEventOperation is the name of the operation that a provider's
// webhook event starts; StepConfirm is its only step.
const (
	ProviderEventOperation = "provider_event"
	StepConfirm            = "confirm"
)

// EventRefundSucceeded is the type of the provider's event about a refund it
// made, the one event that the demo acts on.
const EventRefundSucceeded = "refund.succeeded"

// ProviderEventInput is a provider's webhook event, as its body says, and the
// input of the provider event operation. Every delivery of an event carries
// the same body (but its signature), so every delivery makes the same input.
type ProviderEventInput struct {
	// ID is the provider's id of the event: the operation's key.
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
}

// ProviderEventState is the provider event operation's state: none.
type ProviderEventState struct{}

// ProviderEventResult is the provider event operation's result.
type ProviderEventResult struct {
	EventID          string `json:"eventId"`
	ProviderRefundID string `json:"providerRefundId"`
}

// newProviderEvent declares the provider event operation.
func (w *Workflows) newProviderEvent(opts *engine.OperationOpts) (*engine.Operation[ProviderEventInput, ProviderEventState, ProviderEventResult], error) {
	return engine.NewOperation(ProviderEventOperation, []engine.Step[ProviderEventInput, ProviderEventState]{
		engine.TxStep(StepConfirm, w.confirm),
	}, func(in ProviderEventInput, _ *ProviderEventState) (ProviderEventResult, error) {
		return ProviderEventResult{EventID: in.ID, ProviderRefundID: in.Data.RefundID}, nil
	}, opts)
}

// confirm is the step StepConfirm: in one statement (ProviderEventRecord),
// sent with the checkpoint and COMMIT (engine.AtCommit), it records the event
// and confirms the refund it names, or keeps it for the refund's finalize step
// to apply when the refund has not got there yet (see the package
// documentation, "Webhooks").
func (w *Workflows) confirm(ctx context.Context, tx engine.Tx, at engine.Attempt, in ProviderEventInput, _ *ProviderEventState) error {
	if in.Data.RefundID == "" {
		return engine.Fail(CodeInvalidRequest, "the event names no refund")
	}
	err := w.q.ProviderEventRecord(ctx, engine.AtCommit(tx), refunddb.ProviderEventRecordParams{
		EventID:          at.OperationKey,
		Type:             in.Type,
		ProviderRefundID: in.Data.RefundID,
		OrderID:          in.Data.OrderID,
		Amount:           in.Data.Amount,
		OperationID:      pguuid.UUID(at.OperationID),
	})
	if err != nil {
		return fmt.Errorf("record provider event %s: %w", at.OperationKey, err)
	}
	return nil
}
