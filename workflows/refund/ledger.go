package refund

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// MerchantAccount is the ledger account of the client itself.
const MerchantAccount = "merchant"

// CustomerAccount returns the ledger account of one of the client's customers.
func CustomerAccount(customerID string) string {
	return "customer:" + customerID
}

// The kinds of ledger move.
const (
	moveOrder          = "order"
	moveRefund         = "refund"
	moveRefundReversal = "refund_reversal"
)

// move is one move of money within a client's ledger.
type move struct {
	client   string
	kind     string
	from, to string
	amount   int64
	orderID  string
	refundID string
}

// write records the move's two entries, which sum to zero.
func (m move) write(ctx context.Context, q *refunddb.Queries, tx refunddb.DBTX) error {
	p := refunddb.LedgerMoveParams{
		Client:      m.client,
		MoveID:      uuid.Must(uuid.NewV7()),
		FromAccount: m.from,
		ToAccount:   m.to,
		Amount:      m.amount,
		Kind:        m.kind,
		OrderID:     m.orderID,
	}
	if m.refundID != "" {
		p.RefundID = &m.refundID
	}
	if err := q.LedgerMove(ctx, tx, p); err != nil {
		return fmt.Errorf("ledger move %s of %d from %s to %s: %w", m.kind, m.amount, m.from, m.to, err)
	}
	return nil
}
