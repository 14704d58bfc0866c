package refund

import (
	"context"
	"fmt"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// ProviderEventOperation is the name of the operation that a provider's
// webhook event started before the demo's endpoint recorded events itself
// (RecordProviderEvent, in the transaction of entry/webhook's Outcomes);
// StepConfirm is its only step. No event starts one any more: the definition
// stays registered so that an operation of this type that a database holds
// unfinished (a deploy during a delivery) still finishes, on any process. It
// can go once no database holds one.
const (
	ProviderEventOperation = "provider_event"
	StepConfirm            = "confirm"
)

// ProviderEventState is the provider event operation's state: none.
type ProviderEventState struct{}

// ProviderEventResult is the provider event operation's result.
type ProviderEventResult struct {
	EventID          string `json:"eventId"`
	ProviderRefundID string `json:"providerRefundId"`
}

// newProviderEvent declares the provider event operation, kept for the
// operations started before (see ProviderEventOperation).
func (w *Workflows) newProviderEvent(opts *engine.OperationOpts) (*engine.Operation[ProviderEventInput, ProviderEventState, ProviderEventResult], error) {
	return engine.NewOperation(ProviderEventOperation, []engine.Step[ProviderEventInput, ProviderEventState]{
		engine.TxStep(StepConfirm, w.confirm),
	}, func(in ProviderEventInput, _ *ProviderEventState) (ProviderEventResult, error) {
		return ProviderEventResult{EventID: in.ID, ProviderRefundID: in.Data.RefundID}, nil
	}, opts)
}

// confirm is the step StepConfirm of a provider event operation started
// before: it does what RecordProviderEvent does (without the body's digests,
// which such an operation's input does not have), in its step's transaction,
// and records the event, in one statement (ProviderEventRecord) sent with
// the checkpoint and COMMIT (engine.AtCommit).
func (w *Workflows) confirm(ctx context.Context, tx engine.Tx, at engine.Attempt, in ProviderEventInput, _ *ProviderEventState) error {
	if in.Data.RefundID == "" {
		return engine.Fail(CodeInvalidRequest, "the event names no refund")
	}
	if e := w.engine.Load(); e != nil && in.Data.IdempotencyKey != "" {
		ptx, err := engine.PgxTx(ctx, tx)
		if err != nil {
			return err
		}
		if _, err := e.RecordOutcome(ctx, ptx, EventOutcome(in)); err != nil {
			return err
		}
		if err := w.checkRecord(ctx, ptx, in); err != nil {
			return err
		}
	}
	// A failed refund's event is recorded too; nothing finalizes such a
	// refund, so nothing confirms it.
	opID := pguuid.UUID(at.OperationID)
	err := w.q.ProviderEventRecord(ctx, engine.AtCommit(tx), refunddb.ProviderEventRecordParams{
		EventID:          at.OperationKey,
		Type:             in.Type,
		ProviderRefundID: in.Data.RefundID,
		OrderID:          in.Data.OrderID,
		Amount:           in.Data.Amount,
		OperationID:      &opID,
	})
	if err != nil {
		return fmt.Errorf("record provider event %s: %w", at.OperationKey, err)
	}
	return nil
}
