package refund

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// The names of the operations and of their steps, as the engine records them.
const (
	OrderOperation  = "order"
	RefundOperation = "refund"

	// StepRecord is the order operation's only step.
	StepRecord = "record"

	// The refund operation's steps, in order.
	StepLedger   = "ledger"
	StepProvider = "provider"
	StepFinalize = "finalize"
)

// The codes of the permanent errors (engine.PermanentError) that end the
// operations. The demo answers them with 409, 404, 422, 402 and 400.
const (
	CodeOrderExists             = "order_exists"
	CodeOrderNotFound           = "order_not_found"
	CodeAmountExceedsRefundable = "amount_exceeds_refundable"
	CodeProviderDeclined        = "provider_declined"
	// CodeInvalidRequest is an input that the caller should have rejected: an
	// empty order or customer id, or an amount that is not positive.
	CodeInvalidRequest = "invalid_request"
	// CodeProviderMismatch halts a refund (engine.Halt) whose provider answered,
	// under the derived key, a refund of another order or amount.
	CodeProviderMismatch = "provider_mismatch"
)

// RefundIDPrefix starts every refund id.
const RefundIDPrefix = "re_"

var (
	// ErrOrderNotFound is returned by GetOrder when the client has no such order.
	ErrOrderNotFound = errors.New("refund: order not found")
	// ErrRefundNotFound is returned by GetRefund when the client has no such refund.
	ErrRefundNotFound = errors.New("refund: refund not found")
)

// DBTX is what the reads run on: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures the operations that New returns. The zero value takes every
// default.
type Config struct {
	// Retry is the retry policy of the steps of both operations. Zero fields take
	// the engine's defaults (see engine.RetryPolicy); the demo's -retry-backoff
	// sets Base.
	Retry engine.RetryPolicy
}

// Workflows holds the demo's operation types. Make it with New.
type Workflows struct {
	// Order records an order that a customer paid. Its result is the new Order.
	Order *engine.Operation[OrderInput, OrderState, Order]
	// Refund refunds part or all of an order through the provider. Its result is
	// the succeeded Refund.
	Refund *engine.Operation[RefundInput, RefundState, Refund]

	provider Provider
	q        *refunddb.Queries
}

// New declares the order and refund operations, with refunds asked of provider.
// cfg may be nil.
func New(provider Provider, cfg *Config) (*Workflows, error) {
	if provider == nil {
		return nil, errors.New("refund: provider is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	w := &Workflows{provider: provider, q: refunddb.New()}
	// metadata is the client's, stored and never compared: a retry that changes
	// only it is the same request.
	opts := &engine.OperationOpts{Retry: cfg.Retry, Unfingerprinted: []string{"metadata"}}

	var err error
	w.Order, err = engine.NewOperation(OrderOperation, []engine.Step[OrderInput, OrderState]{
		engine.TxStep(StepRecord, w.recordOrder),
	}, orderResult, opts)
	if err != nil {
		return nil, fmt.Errorf("refund: %w", err)
	}
	w.Refund, err = engine.NewOperation(RefundOperation, []engine.Step[RefundInput, RefundState]{
		engine.TxStep(StepLedger, w.ledger).Compensate(w.reverseLedger),
		engine.ExternalStep(StepProvider, w.callProvider).Lookup(w.lookupProvider),
		engine.TxStep(StepFinalize, w.finalize),
	}, refundResult, opts)
	if err != nil {
		return nil, fmt.Errorf("refund: %w", err)
	}
	return w, nil
}

// Operations returns both operation types, for engine.Config.Operations.
func (w *Workflows) Operations() []engine.Definition {
	return []engine.Definition{w.Order, w.Refund}
}

// newID returns prefix followed by 26 random base32 characters.
func newID(prefix string) string {
	return prefix + rand.Text()
}
