package refund

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// OrderInput is the input of the order operation.
type OrderInput struct {
	// Client owns the order.
	Client string `json:"client"`
	// OrderID is the client's id for the order, unique per client.
	OrderID string `json:"orderId"`
	// CustomerID is the client's id for the customer who paid.
	CustomerID string `json:"customerId"`
	// Amount is what the customer paid, in minor units; positive.
	Amount int64 `json:"amount"`
	// Metadata is the client's own, stored with the operation and never read.
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// OrderState is the order operation's state between steps: none, since it has
// one step.
type OrderState struct{}

// recordOrder is the step StepRecord.
func (w *Workflows) recordOrder(ctx context.Context, tx engine.Tx, _ engine.Attempt, in OrderInput, _ *OrderState) error {
	switch {
	case in.OrderID == "":
		return engine.Fail(CodeInvalidRequest, "orderId must not be empty")
	case in.CustomerID == "":
		return engine.Fail(CodeInvalidRequest, "customerId must not be empty")
	case in.Amount <= 0:
		return engine.Fail(CodeInvalidRequest, "amount must be a positive integer")
	}
	_, err := w.q.OrderInsert(ctx, tx, refunddb.OrderInsertParams{
		Client:     in.Client,
		OrderID:    in.OrderID,
		CustomerID: in.CustomerID,
		Amount:     in.Amount,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Fail(CodeOrderExists, fmt.Sprintf("order %s already exists", in.OrderID))
	}
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	return move{
		client:  in.Client,
		kind:    moveOrder,
		from:    CustomerAccount(in.CustomerID),
		to:      MerchantAccount,
		amount:  in.Amount,
		orderID: in.OrderID,
	}.write(ctx, w.q, tx)
}

func orderResult(in OrderInput, _ *OrderState) (Order, error) {
	return Order{
		OrderID:    in.OrderID,
		CustomerID: in.CustomerID,
		Amount:     in.Amount,
		Refunds:    []OrderRefund{},
	}, nil
}
