package refund

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// Approval is a refund that waits for operators' approval (version 3's
// approval step), as ListApprovals returns it.
type Approval struct {
	OperationID uuid.UUID `json:"operationId"`
	// Client, OrderID and Amount are the refund's.
	Client  string `json:"client"`
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
	// RequestedAt is when the refund reached its approval step, ExpiresAt
	// when its wait expires (nil: never), both by the database's clock and
	// fixed then.
	RequestedAt time.Time  `json:"requestedAt"`
	ExpiresAt   *time.Time `json:"expiresAt"`
	// Need is how many distinct operators must approve it (not in the demo's
	// JSON, which the contract fixes).
	Need int `json:"-"`
	// ApprovedBy are the operators who approved it so far, in the order they
	// did; never nil.
	ApprovedBy []string `json:"approvedBy"`
}

// ApprovalLister lists the operations that wait for approvals: an
// *engine.Engine or an *engine.Admin.
type ApprovalLister interface {
	Approvals(ctx context.Context, limit int) ([]engine.AwaitingApproval, error)
}

// ListApprovals returns at most limit refunds that wait for approval (limit 0:
// 100), the oldest first: those that the engine lists (e's Approvals), each
// with its client, order and amount read from its refund in db. Operations
// of other names that wait for approvals are left out.
func ListApprovals(ctx context.Context, db DBTX, e ApprovalLister, limit int) ([]Approval, error) {
	waiting, err := e.Approvals(ctx, limit)
	if err != nil {
		return nil, fmt.Errorf("refund: list approvals: %w", err)
	}
	ids := make([]pguuid.UUID, 0, len(waiting))
	for _, a := range waiting {
		if a.Name == RefundOperation {
			ids = append(ids, pguuid.UUID(a.OperationID))
		}
	}
	out := make([]Approval, 0, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := refunddb.New().RefundListByOperation(ctx, db, ids)
	if err != nil {
		return nil, fmt.Errorf("refund: list approvals: %w", err)
	}
	refunds := make(map[uuid.UUID]int, len(rows))
	for i, r := range rows {
		refunds[uuid.UUID(r.OperationID)] = i
	}
	for _, a := range waiting {
		if a.Name != RefundOperation {
			continue
		}
		ap := Approval{OperationID: a.OperationID, Client: a.Scope, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt,
			Need: a.Need, ApprovedBy: append([]string{}, a.ApprovedBy...)}
		// The ledger step recorded the refund in the transaction of its
		// checkpoint, before the approval step was reached: it is there.
		if i, ok := refunds[a.OperationID]; ok {
			r := rows[i]
			ap.Client, ap.OrderID, ap.Amount = r.Client, r.OrderID, r.Amount
		}
		out = append(out, ap)
	}
	return out, nil
}
