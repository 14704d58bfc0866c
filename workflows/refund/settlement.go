package refund

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// SettlementOperation is the name of the settlement operation; StepSettle is
// its only step.
const (
	SettlementOperation = "settlement"
	StepSettle          = "settle"
)

// CodeSettlementExists fails a settlement whose (client, slot) was settled
// already: by an operation that the engine's retention has deleted since, for
// the key of a live one is never started twice.
const CodeSettlementExists = "settlement_exists"

// PayoutAccount returns the ledger account that a settlement of slot pays the
// client's merchant balance into: "payout:" and the slot in UTC, RFC 3339 with
// seconds.
func PayoutAccount(slot time.Time) string {
	return "payout:" + slot.UTC().Format(time.RFC3339)
}

// SettlementInput is the input of the settlement operation: who, and which
// slot (the start of the settlement's period, UTC). It is made from the scope
// and the slot alone, as entry/schedule needs: every process that fires a
// slot builds the same.
type SettlementInput struct {
	Client string    `json:"client"`
	Slot   time.Time `json:"slot"`
}

// SettlementState is the settlement operation's state: what it moved, and the
// operation's id for its result.
type SettlementState struct {
	Amount      int64     `json:"amount"`
	OperationID uuid.UUID `json:"operationId"`
}

// Settlement is a settlement as the demo's API shows it, and the settlement
// operation's result.
type Settlement struct {
	Slot        time.Time `json:"slot"`
	Amount      int64     `json:"amount"`
	OperationID uuid.UUID `json:"operationId"`
}

// newSettlement declares the settlement operation.
func (w *Workflows) newSettlement(opts *engine.OperationOpts) (*engine.Operation[SettlementInput, SettlementState, Settlement], error) {
	return engine.NewOperation(SettlementOperation, []engine.Step[SettlementInput, SettlementState]{
		engine.TxStep(StepSettle, w.settle),
	}, settlementResult, opts)
}

// settlementResult reads the operation's id from the state, where the step,
// which sees it, put it.
func settlementResult(in SettlementInput, s *SettlementState) (Settlement, error) {
	return Settlement{Slot: in.Slot.UTC(), Amount: s.Amount, OperationID: s.OperationID}, nil
}

// settle is the step StepSettle: after the client's settlement lock, one
// statement (SettlementMake) reads the merchant's balance, records the
// settlement and moves the balance to the slot's payout account. The
// settlement's row is keyed by (client, slot), so a slot that was settled
// already fails the operation for good (CodeSettlementExists) rather than pay
// out again.
func (w *Workflows) settle(ctx context.Context, tx engine.Tx, at engine.Attempt, in SettlementInput, s *SettlementState) error {
	if in.Client == "" || in.Slot.IsZero() {
		return engine.Fail(CodeInvalidRequest, "a settlement needs a client and a slot")
	}
	if err := w.q.SettlementLock(ctx, tx, in.Client); err != nil {
		return fmt.Errorf("lock the settlements of %s: %w", in.Client, err)
	}
	amount, err := w.q.SettlementMake(ctx, tx, refunddb.SettlementMakeParams{
		Client:          in.Client,
		MerchantAccount: MerchantAccount,
		Slot:            in.Slot.UTC(),
		OperationID:     pguuid.UUID(at.OperationID),
		MoveID:          pguuid.UUID(uuid.Must(uuid.NewV7())),
		PayoutAccount:   PayoutAccount(in.Slot),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Fail(CodeSettlementExists, fmt.Sprintf("the slot %s of %s is settled already", in.Slot.UTC().Format(time.RFC3339), in.Client))
	}
	if err != nil {
		return fmt.Errorf("settle %s: %w", in.Client, err)
	}
	s.Amount, s.OperationID = amount, at.OperationID
	return nil
}

// ListSettlements returns the client's settlements, oldest slot first; an
// empty, non-nil slice when it has none.
func ListSettlements(ctx context.Context, db DBTX, client string) ([]Settlement, error) {
	rows, err := refunddb.New().SettlementList(ctx, db, client)
	if err != nil {
		return nil, fmt.Errorf("refund: list settlements: %w", err)
	}
	out := make([]Settlement, 0, len(rows))
	for _, r := range rows {
		out = append(out, Settlement{Slot: r.Slot.UTC(), Amount: r.Amount, OperationID: uuid.UUID(r.OperationID)})
	}
	return out, nil
}
