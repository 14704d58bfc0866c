package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/steps/httpstep"
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
	// Receipt is the refund's receipt number, set by the receipt step of
	// version 2; empty in version 1.
	Receipt string `json:"receipt,omitempty"`
}

// ledger is the step StepLedger. Its one statement, RefundRecord, takes the
// amount from what is left to refund of the order, records the refund as
// pending (with its operation's id, which ListApprovals reads) and moves the amount from the merchant to the customer, or fails the
// step for good when the order does not exist or has less than the amount
// left. It goes with the step's checkpoint and COMMIT (engine.AtCommit), and on
// a first attempt with BEGIN and the key's reservation too: one round trip.
func (w *Workflows) ledger(ctx context.Context, tx engine.Tx, at engine.Attempt, in RefundInput, s *RefundState) error {
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
		OperationID:           pguuid.UUID(at.OperationID),
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

// callProvider is the step StepProvider. With a ProviderClient (the demo's,
// and every test's) it is an idempotent HTTP call (providerCall, on httpstep):
// the refund asked (refundAsked) under the step's derived key, the answer
// classified (classifyRefund) and read into the state (decodeRefund); any
// other Provider is called through its methods, with the same rules.
func (w *Workflows) callProvider(ctx context.Context, at engine.Attempt, in RefundInput, s *RefundState) error {
	if c, ok := w.provider.(*ProviderClient); ok {
		return providerCall(c).Run(ctx, at, in, s)
	}
	ref, err := w.provider.Refund(ctx, at.Key, refundAsked(in, s))
	if errors.Is(err, ErrProviderDeclined) {
		return declined()
	}
	if err != nil {
		return err
	}
	return recordRefund(ref, in, s)
}

// lookupProvider asks the provider whether an earlier attempt of StepProvider,
// whose answer was lost, made the refund: with a ProviderClient, a GET of the
// refund made under the derived key, whose 404 means "none made" only with the
// provider's own code refund_not_found.
func (w *Workflows) lookupProvider(ctx context.Context, at engine.Attempt, in RefundInput, s *RefundState) (bool, error) {
	if c, ok := w.provider.(*ProviderClient); ok {
		return providerCall(c).Find(ctx, at, in, s)
	}
	ref, found, err := w.provider.ByKey(ctx, at.Key)
	if err != nil || !found {
		return false, err
	}
	if ref == nil {
		return false, errors.New("the provider's lookup found no refund")
	}
	if err := recordRefund(ref, in, s); err != nil {
		return false, err
	}
	return true, nil
}

// providerCall is StepProvider as an httpstep call of c: its Run is the step,
// its Find the lookup.
func providerCall(c *ProviderClient) httpstep.Call[RefundInput, RefundState] {
	return httpstep.Call[RefundInput, RefundState]{
		Client: c.client(),
		RequestFunc: func(_ context.Context, _ engine.Attempt, in RefundInput, s *RefundState) (httpstep.Request, error) {
			return c.refundRequest(refundAsked(in, s)), nil
		},
		ClassifyFunc: classifyRefund,
		DecodeFunc:   decodeRefund,
		Lookup:       byKeyLookup[RefundInput, RefundState](c),
	}
}

// refundAsked is the refund that StepProvider asks of the provider: the
// input's order and amount, with our refund's id as the reference.
func refundAsked(in RefundInput, s *RefundState) ProviderRequest {
	return ProviderRequest{OrderID: in.OrderID, Amount: in.Amount, Reference: s.RefundID}
}

// classifyRefund says what a provider's answer to the refund means: a 2xx is
// the refund made, a 402 a decline, which fails the operation (and reverses
// the ledger move); every other answer, a refusal included, is transient, as
// Provider says of every error but a decline, and retried with the same key
// after the answer's Retry-After when it has one.
func classifyRefund(a httpstep.Answer) error {
	if a.StatusCode == http.StatusPaymentRequired {
		return declined()
	}
	err := httpstep.Classify(a)
	if pe := (*engine.PermanentError)(nil); errors.As(err, &pe) {
		return newProviderError(a)
	}
	return err
}

// decodeRefund reads the provider's refund, from the answer to the refund or
// from the lookup, into the state, once it is the refund asked for (matches).
func decodeRefund(_ engine.Attempt, in RefundInput, s *RefundState, a httpstep.Answer) error {
	ref, err := decodeProviderRefund(a)
	if err != nil {
		return err
	}
	return recordRefund(ref, in, s)
}

// recordRefund puts the provider's refund ref in the state, once it is the
// refund asked for and final: a pending refund is engine.Accepted (the step
// waits for the provider's word), a failed one a business answer (it paid
// nothing, and the ledger move is reversed).
func recordRefund(ref *ProviderRefund, in RefundInput, s *RefundState) error {
	if ref.ID == "" {
		return errors.New("the provider answered a refund without an id")
	}
	if err := matches(ref, in, s); err != nil {
		return err
	}
	switch ref.Status {
	case ProviderStatusSucceeded, "":
	case ProviderStatusPending:
		return engine.Accepted(ref.ID, fmt.Sprintf("the provider's refund %s is pending", ref.ID))
	case ProviderStatusFailed:
		return refundFailed()
	default:
		return fmt.Errorf("the provider answered refund %s with an unknown status %q", ref.ID, ref.Status)
	}
	s.ProviderRefundID = ref.ID
	return nil
}

// resolveProvider records the provider's refund that an operator says the
// provider step made (engine.Engine.Resolve): its id, as the step would have.
func resolveProvider(_ RefundInput, s *RefundState, reference string) error {
	if !strings.HasPrefix(reference, "pr_") || len(reference) > 255 {
		return fmt.Errorf("%q is not a provider refund id (pr_...)", reference)
	}
	s.ProviderRefundID = reference
	return nil
}

// refundFailed is the answer of a refund that the provider accepted as
// pending, then failed.
func refundFailed() *engine.PermanentError {
	return engine.Fail(CodeProviderRefundFailed, "the payment provider failed the refund; nothing was refunded")
}

func declined() error {
	return engine.Fail(CodeProviderDeclined, "the payment provider declined the refund")
}

// matches halts the operation when the provider's refund under the derived key
// is not the one asked for (another order, amount or reference): that is no
// success, and nothing may be undone on a guess either. An answer that does
// not tell the order or the amount does not match; the reference is compared
// when the answer tells it.
func matches(ref *ProviderRefund, in RefundInput, s *RefundState) error {
	if ref.OrderID != in.OrderID || ref.Amount != in.Amount || ref.Reference != "" && ref.Reference != s.RefundID {
		return engine.Halt(CodeProviderMismatch, fmt.Sprintf(
			"the provider's refund %s under the derived key is for order %q, amount %d, reference %q; asked: order %q, amount %d, reference %q",
			ref.ID, ref.OrderID, ref.Amount, ref.Reference, in.OrderID, in.Amount, s.RefundID))
	}
	return nil
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

// receipt is the step StepReceipt of version 2: it gives the succeeded refund
// a receipt number. Its one write goes with the step's checkpoint and COMMIT
// (engine.AtCommit), and fails on its own when the refund is not succeeded or
// has a receipt.
func (w *Workflows) receipt(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ RefundInput, s *RefundState) error {
	number := newID(ReceiptPrefix)
	err := w.q.RefundSetReceipt(ctx, engine.AtCommit(tx), refunddb.RefundSetReceiptParams{ID: s.RefundID, Receipt: number})
	if err != nil {
		return fmt.Errorf("give refund %s its receipt: %w", s.RefundID, err)
	}
	s.Receipt = number
	return nil
}

func refundResult(in RefundInput, s *RefundState) (Refund, error) {
	if s.RefundID == "" || s.ProviderRefundID == "" {
		return Refund{}, fmt.Errorf("refund of order %s finished without its ids", in.OrderID)
	}
	providerID := s.ProviderRefundID
	r := Refund{
		RefundID:         s.RefundID,
		OrderID:          in.OrderID,
		Amount:           in.Amount,
		Status:           StatusSucceeded,
		ProviderRefundID: &providerID,
	}
	if s.Receipt != "" {
		r.Receipt = &s.Receipt
	}
	return r, nil
}
