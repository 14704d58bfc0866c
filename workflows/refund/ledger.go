package refund

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// MerchantAccount is the ledger account of the client itself.
const MerchantAccount = "merchant"

// CustomerAccount returns the ledger account of one of the client's customers.
func CustomerAccount(customerID string) string {
	return "customer:" + customerID
}

// moveOrder is the kind of an order's ledger move. A refund's moves, of kinds
// "refund" and "refund_reversal", are written by the statements that record
// and fail the refund (see queries/refund/refund.sql).
const moveOrder = "order"

// move is one move of money within a client's ledger.
type move struct {
	client   string
	kind     string
	from, to string
	amount   int64
	orderID  string
}

// write records the move's two entries, which sum to zero.
func (m move) write(ctx context.Context, q *refunddb.Queries, tx refunddb.DBTX) error {
	if err := q.LedgerMove(ctx, tx, refunddb.LedgerMoveParams{
		Client:      m.client,
		MoveID:      pguuid.UUID(uuid.Must(uuid.NewV7())),
		FromAccount: m.from,
		ToAccount:   m.to,
		Amount:      m.amount,
		Kind:        m.kind,
		OrderID:     m.orderID,
	}); err != nil {
		return fmt.Errorf("ledger move %s of %d from %s to %s: %w", m.kind, m.amount, m.from, m.to, err)
	}
	return nil
}
