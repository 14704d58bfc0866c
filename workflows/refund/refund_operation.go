package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// RefundInput is the input of the refund operation.
type RefundInput struct {
	// Client owns the order, and will own the refund.
	Client string `json:"client"`
	// OrderID is the client's id of the order to refund.
	OrderID string `json:"orderId"`
	// Amount is how much to refund, in minor units; positive, and at most what is
	// left to refund of the order.
	Amount int64 `json:"amount"`
	// Metadata is the client's own, stored with the operation and never read.
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// RefundState is the refund operation's state between steps, checkpointed by the
// engine after each.
type RefundState struct {
	// RefundID is the refund's id, chosen by the ledger step.
	RefundID string `json:"refundId"`
	// ProviderRefundID is the provider's id of the refund, set by the provider step.
	ProviderRefundID string `json:"providerRefundId"`
}

// ledger is the step StepLedger. Its one statement, RefundRecord, takes the
// amount from what is left to refund of the order, records the refund as
// pending and moves the amount from the merchant to the customer, or fails the
// step for good when the order does not exist or has less than the amount
// left. It goes with the step's checkpoint and COMMIT (engine.AtCommit), and on
// a first attempt with BEGIN and the key's reservation too: one round trip.
func (w *Workflows) ledger(ctx context.Context, tx engine.Tx, _ engine.Attempt, in RefundInput, s *RefundState) error {
	if in.Amount <= 0 {
		return engine.Fail(CodeInvalidRequest, "amount must be a positive integer")
	}
	id := newID(RefundIDPrefix)
	err := w.q.RefundRecord(ctx, engine.AtCommit(tx), refunddb.RefundRecordParams{
		ID:                    id,
		Client:                in.Client,
		OrderID:               in.OrderID,
		Amount:                in.Amount,
		MoveID:                pguuid.UUID(uuid.Must(uuid.NewV7())),
		MerchantAccount:       MerchantAccount,
		CustomerAccountPrefix: CustomerAccount(""),
		OrderNotFoundCode:     CodeOrderNotFound,
		AmountExceededCode:    CodeAmountExceedsRefundable,
	})
	if err != nil {
		return fmt.Errorf("record refund: %w", err)
	}
	s.RefundID = id
	return nil
}

// reverseLedger compensates StepLedger in one statement, RefundFail: it marks
// the refund failed, moves the amount back from the customer to the merchant,
// and gives it back to what is left to refund of the order.
func (w *Workflows) reverseLedger(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ RefundInput, s *RefundState) error {
	n, err := w.q.RefundFail(ctx, tx, refunddb.RefundFailParams{
		ID:                    s.RefundID,
		MoveID:                pguuid.UUID(uuid.Must(uuid.NewV7())),
		CustomerAccountPrefix: CustomerAccount(""),
		MerchantAccount:       MerchantAccount,
	})
	if err != nil {
		return fmt.Errorf("mark refund %s failed: %w", s.RefundID, err)
	}
	if n != 1 {
		return engine.Permanent(fmt.Errorf("refund %s is not pending", s.RefundID))
	}
	return nil
}

// callProvider is the step StepProvider.
func (w *Workflows) callProvider(ctx context.Context, at engine.Attempt, in RefundInput, s *RefundState) error {
	ref, err := w.provider.Refund(ctx, at.Key, ProviderRequest{
		OrderID:   in.OrderID,
		Amount:    in.Amount,
		Reference: s.RefundID,
	})
	if errors.Is(err, ErrProviderDeclined) {
		return engine.Fail(CodeProviderDeclined, "the payment provider declined the refund")
	}
	if err != nil {
		return err
	}
	if ref == nil || ref.ID == "" {
		return errors.New("the provider answered a refund without an id")
	}
	if err := matches(ref, in); err != nil {
		return err
	}
	s.ProviderRefundID = ref.ID
	return nil
}

// matches halts the operation when the provider's refund under the derived key
// is not the one asked for (another order or amount): that is no success, and
// nothing may be undone on a guess either. An answer that does not tell the
// order or the amount is taken as it is.
func matches(ref *ProviderRefund, in RefundInput) error {
	if ref.OrderID != "" && ref.OrderID != in.OrderID || ref.Amount != 0 && ref.Amount != in.Amount {
		return engine.Halt(CodeProviderMismatch, fmt.Sprintf(
			"the provider's refund %s under the derived key is for order %q, amount %d; asked: order %q, amount %d",
			ref.ID, ref.OrderID, ref.Amount, in.OrderID, in.Amount))
	}
	return nil
}

// lookupProvider asks the provider whether an earlier attempt of StepProvider,
// whose answer was lost, made the refund.
func (w *Workflows) lookupProvider(ctx context.Context, at engine.Attempt, in RefundInput, s *RefundState) (bool, error) {
	ref, found, err := w.provider.ByKey(ctx, at.Key)
	if err != nil || !found {
		return false, err
	}
	if ref == nil || ref.ID == "" {
		return false, errors.New("the provider's lookup found a refund without an id")
	}
	if err := matches(ref, in); err != nil {
		return false, err
	}
	s.ProviderRefundID = ref.ID
	return true, nil
}

// finalize is the step StepFinalize. Its one write goes with the step's
// checkpoint and COMMIT (engine.AtCommit): the statement itself fails when the
// refund is not pending.
func (w *Workflows) finalize(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ RefundInput, s *RefundState) error {
	err := w.q.RefundMarkSucceeded(ctx, engine.AtCommit(tx), refunddb.RefundMarkSucceededParams{
		ID:               s.RefundID,
		ProviderRefundID: s.ProviderRefundID,
	})
	if err != nil {
		return fmt.Errorf("mark refund %s succeeded: %w", s.RefundID, err)
	}
	return nil
}

func refundResult(in RefundInput, s *RefundState) (Refund, error) {
	if s.RefundID == "" || s.ProviderRefundID == "" {
		return Refund{}, fmt.Errorf("refund of order %s finished without its ids", in.OrderID)
	}
	providerID := s.ProviderRefundID
	return Refund{
		RefundID:         s.RefundID,
		OrderID:          in.OrderID,
		Amount:           in.Amount,
		Status:           StatusSucceeded,
		ProviderRefundID: &providerID,
	}, nil
}
