package refund

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/reconcile"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// ProviderEventOperation is the name of the operation that a provider's
// webhook event starts; StepConfirm is its only step.
const (
	ProviderEventOperation = "provider_event"
	StepConfirm            = "confirm"
)

// The types of the provider's events that the demo acts on:
// EventRefundSucceeded for a refund it made (at once, or after it was
// pending), EventRefundFailed for a pending refund that it failed (it paid
// nothing).
const (
	EventRefundSucceeded = "refund.succeeded"
	EventRefundFailed    = "refund.failed"
)

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
	// Status is the refund's status: "succeeded" or "failed".
	Status string `json:"status,omitempty"`
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
//
// It then keeps the event in the engine's inbox under the refund's derived
// key, in the same transaction, for the refund's provider step whenever it
// waits (see the package documentation, "Late and unknown outcomes"): a
// success for the order and amount asked goes forward, even while the
// provider's lookup lags; a failure counts only when the lookup, asked then,
// does not contradict it.
func (w *Workflows) confirm(ctx context.Context, tx engine.Tx, at engine.Attempt, in ProviderEventInput, _ *ProviderEventState) error {
	if in.Data.RefundID == "" {
		return engine.Fail(CodeInvalidRequest, "the event names no refund")
	}
	if err := w.settleWaiting(ctx, tx, in); err != nil {
		return err
	}
	if err := w.checkRecord(ctx, tx, in); err != nil {
		return err
	}
	// A failed refund's event is recorded too; nothing finalizes such a
	// refund, so nothing confirms it.
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

// settleWaiting hands the event to the engine's inbox under the refund's
// derived key, when Bind gave the workflows their engine: the refund's
// provider step applies it whenever it waits, whether the event came before or
// after (see the package documentation, "Late and unknown outcomes").
func (w *Workflows) settleWaiting(ctx context.Context, tx engine.Tx, in ProviderEventInput) error {
	e := w.engine.Load()
	if e == nil || in.Data.IdempotencyKey == "" {
		return nil
	}
	ptx, err := engine.PgxTx(ctx, tx)
	if err != nil {
		return err
	}
	o := engine.Outcome{EventID: in.ID, Record: reconcile.Record{
		Key: in.Data.IdempotencyKey, Reference: in.Data.RefundID, Amount: in.Data.Amount, Status: reconcile.Succeeded,
		Data: RecordData{OrderID: in.Data.OrderID},
	}}
	if in.Type == EventRefundFailed {
		o.Record.Status, o.Failure = reconcile.Failed, refundFailed()
	}
	_, err = e.RecordOutcome(ctx, ptx, o)
	return err
}

// checkRecord checks the event's refund against the refund operation that
// holds its key, as a reconciliation run would, in the event's transaction:
// a refund the provider made for a refund whose operation failed, or for
// another order or amount, is a mismatch at once (see Workflows.Bind). Without
// an engine, or with one whose reconciliation has no provider source, the
// next run finds it instead.
func (w *Workflows) checkRecord(ctx context.Context, tx engine.Tx, in ProviderEventInput) error {
	e := w.engine.Load()
	if e == nil || in.Data.IdempotencyKey == "" {
		return nil
	}
	ptx, err := engine.PgxTx(ctx, tx)
	if err != nil {
		return err
	}
	status := reconcile.Succeeded
	if in.Type == EventRefundFailed {
		status = reconcile.Failed
	}
	_, err = e.CheckRecord(ctx, ptx, ProviderSource, reconcile.Record{
		Key: in.Data.IdempotencyKey, Reference: in.Data.RefundID, Amount: in.Data.Amount, Status: status,
		Data: RecordData{OrderID: in.Data.OrderID},
	})
	if errors.Is(err, engine.ErrUnknownSource) {
		return nil
	}
	return err
}
