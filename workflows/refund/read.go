package refund

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// Status is the state of a refund.
type Status string

// The states of a refund.
const (
	// StatusPending: the ledger moved the money; the provider has not confirmed.
	StatusPending Status = "pending"
	// StatusSucceeded: the provider made the refund.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the provider declined; the ledger move was reversed.
	StatusFailed Status = "failed"
)

// Order is an order as the demo's API shows it, and the order operation's result.
type Order struct {
	OrderID    string `json:"orderId"`
	CustomerID string `json:"customerId"`
	Amount     int64  `json:"amount"`
	// Refunded is the sum of the order's succeeded refunds.
	Refunded int64 `json:"refunded"`
	// Refunds lists every refund of the order, oldest first; never nil.
	Refunds []OrderRefund `json:"refunds"`
}

// OrderRefund is a refund as an Order lists it.
type OrderRefund struct {
	RefundID string `json:"refundId"`
	Amount   int64  `json:"amount"`
	Status   Status `json:"status"`
	// ProviderRefundID is the provider's id of the refund once it succeeded, nil
	// (JSON null) before.
	ProviderRefundID *string `json:"providerRefundId"`
}

// Refund is a refund as the demo's API shows it, and the refund operation's result
// (with Status StatusSucceeded).
type Refund struct {
	RefundID string `json:"refundId"`
	OrderID  string `json:"orderId"`
	Amount   int64  `json:"amount"`
	Status   Status `json:"status"`
	// ProviderRefundID is the provider's id of the refund once it succeeded, nil
	// (JSON null) before.
	ProviderRefundID *string `json:"providerRefundId"`
	// Receipt is the receipt number that version 2 gives a succeeded refund;
	// absent for refunds of version 1.
	Receipt *string `json:"receipt,omitempty"`
	// ProviderConfirmed says whether the provider's webhook event about the
	// refund was applied to it. GetRefund sets it; the refund operation's
	// result, stored and replayed as it was, has none.
	ProviderConfirmed *bool `json:"providerConfirmed,omitempty"`
}

// Account is a ledger account of a client and its balance.
type Account struct {
	// Account is MerchantAccount or a CustomerAccount.
	Account string `json:"account"`
	// Balance is the sum of the account's entries, in minor units: what the
	// account received less what it paid.
	Balance int64 `json:"balance"`
}

// GetOrder reads the client's order orderID with its refunds. It returns
// ErrOrderNotFound when the client has no such order.
func GetOrder(ctx context.Context, db DBTX, client, orderID string) (*Order, error) {
	q := refunddb.New()
	row, err := q.OrderGet(ctx, db, refunddb.OrderGetParams{Client: client, OrderID: orderID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrOrderNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("refund: get order: %w", err)
	}
	refunds, err := q.RefundListByOrder(ctx, db, refunddb.RefundListByOrderParams{Client: client, OrderID: orderID})
	if err != nil {
		return nil, fmt.Errorf("refund: list refunds: %w", err)
	}
	o := &Order{
		OrderID:    row.OrderID,
		CustomerID: row.CustomerID,
		Amount:     row.Amount,
		Refunds:    make([]OrderRefund, 0, len(refunds)),
	}
	// Not row.Refunded, which counts the pending refunds too.
	for _, r := range refunds {
		if Status(r.Status) == StatusSucceeded {
			o.Refunded += r.Amount
		}
		o.Refunds = append(o.Refunds, OrderRefund{
			RefundID:         r.ID,
			Amount:           r.Amount,
			Status:           Status(r.Status),
			ProviderRefundID: r.ProviderRefundID,
		})
	}
	return o, nil
}

// GetRefund reads the client's refund refundID. It returns ErrRefundNotFound when
// the client has no such refund.
func GetRefund(ctx context.Context, db DBTX, client, refundID string) (*Refund, error) {
	row, err := refunddb.New().RefundGet(ctx, db, refunddb.RefundGetParams{Client: client, ID: refundID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrRefundNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("refund: get refund: %w", err)
	}
	return &Refund{
		RefundID:          row.ID,
		OrderID:           row.OrderID,
		Amount:            row.Amount,
		Status:            Status(row.Status),
		ProviderRefundID:  row.ProviderRefundID,
		Receipt:           row.Receipt,
		ProviderConfirmed: &row.Confirmed,
	}, nil
}

// ListAccounts returns the client's ledger accounts and their balances, sorted by
// account name in byte order; an empty, non-nil slice when the client has none.
// The balances sum to zero.
func ListAccounts(ctx context.Context, db DBTX, client string) ([]Account, error) {
	rows, err := refunddb.New().LedgerBalances(ctx, db, client)
	if err != nil {
		return nil, fmt.Errorf("refund: list accounts: %w", err)
	}
	accounts := make([]Account, 0, len(rows))
	for _, r := range rows {
		accounts = append(accounts, Account{Account: r.Account, Balance: r.Balance})
	}
	return accounts, nil
}
