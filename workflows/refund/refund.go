package refund

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

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
	// StepReceipt is the step that version 2 adds.
	StepReceipt = "receipt"
	// StepApproval is the step that version 3 adds between StepLedger and
	// StepProvider: large refunds wait there for operators' approval.
	StepApproval = "approval"
)

// The versions of the refund operation's definition: version 1 runs ledger,
// provider and finalize; version 2 adds receipt; version 3 adds approval
// between ledger and provider (see the package documentation, "Approvals").
const (
	RefundV1 = 1
	RefundV2 = 2
	RefundV3 = 3
)

// The defaults of the approval settings of Config.
const (
	// DefaultApprovals is how many distinct operators approve a refund that
	// waits for approval, unless Config.Approvals says otherwise.
	DefaultApprovals = 1
	// DefaultApprovalTimeout is how long a refund waits for its approvals
	// before it expires, unless Config.ApprovalTimeout says otherwise.
	DefaultApprovalTimeout = 72 * time.Hour
	// DefaultApprovalThreshold is the demo's -approval-threshold: refunds of
	// at least 1,000.00 in minor units wait for approval. Config's zero
	// ApprovalThreshold is not this but 0: every refund of version 3 waits.
	DefaultApprovalThreshold = 100_000
)

// ReceiptPrefix starts every receipt number.
const ReceiptPrefix = "rc_"

// The codes of the permanent errors (engine.PermanentError) that end the
// operations. The demo answers them with 409, 404, 422, 402 and 400.
const (
	CodeOrderExists             = "order_exists"
	CodeOrderNotFound           = "order_not_found"
	CodeAmountExceedsRefundable = "amount_exceeds_refundable"
	CodeProviderDeclined        = "provider_declined"
	// CodeProviderRefundFailed: the provider accepted the refund as pending,
	// then failed it: it paid nothing.
	CodeProviderRefundFailed = "provider_refund_failed"
	// CodeInvalidRequest is an input that the caller should have rejected: an
	// empty order or customer id, or an amount that is not positive.
	CodeInvalidRequest = "invalid_request"
	// CodeProviderMismatch halts a refund (engine.Halt) whose provider answered,
	// under the derived key, a refund of another order or amount.
	CodeProviderMismatch = "provider_mismatch"
	// CodeRefundRejected: an operator rejected a refund that waited for
	// approval (version 3). The ledger move was reversed; the provider was
	// never asked.
	CodeRefundRejected = "refund_rejected"
	// CodeApprovalExpired: a refund that waited for approval (version 3) was
	// not approved within Config.ApprovalTimeout. The ledger move was
	// reversed; the provider was never asked. The engine's
	// CodeApprovalExpired.
	CodeApprovalExpired = string(engine.CodeApprovalExpired)
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
	// RefundVersions are the versions of the refund operation to define
	// (RefundV1, RefundV2, RefundV3); nil means version 1 only. New refunds
	// start on the highest.
	RefundVersions []int
	// ProviderSettle is the provider's longest processing time: a refund
	// request that got no definite answer may still be carried out up to this
	// long after it was sent (the provider step's outcome window, see
	// engine.ExternalStepDef.Window). Zero takes the
	// engine's default, 5 minutes.
	ProviderSettle time.Duration
	// ProviderTimeout bounds each call of the provider step
	// (engine.ExternalStepDef.Timeout): New refuses a ProviderSettle shorter
	// than it. Zero sets no bound beyond the provider client's own.
	ProviderTimeout time.Duration

	// ApprovalThreshold: a refund of version 3 of at least this amount (minor
	// units) waits, after its ledger step, for Approvals distinct operators to
	// approve it before the provider is asked; a smaller one passes its
	// approval step at once. Zero: every refund of version 3 waits (amounts
	// are positive). New refuses a negative one. The demo's default is
	// DefaultApprovalThreshold.
	ApprovalThreshold int64
	// Approvals is how many distinct operators must approve a refund that
	// waits for approval. Defaults to DefaultApprovals (1); New refuses a
	// negative number.
	Approvals int
	// ApprovalTimeout is how long a refund waits for its approvals, from the
	// moment it reaches its approval step (by the database's clock), before it
	// expires and fails with CodeApprovalExpired. Defaults to
	// DefaultApprovalTimeout (72 hours); New refuses a negative one.
	//
	// The three approval settings are read when a refund reaches its approval
	// step, and what they asked of it is stored with it then: a process with
	// other settings changes nothing for a refund that waits.
	ApprovalTimeout time.Duration
}

// Workflows holds the demo's operation types. Make it with New.
type Workflows struct {
	// Order records an order that a customer paid. Its result is the new Order.
	Order *engine.Operation[OrderInput, OrderState, Order]
	// Refund refunds part or all of an order through the provider, on the
	// highest of Config.RefundVersions: the version new refunds start on. Its
	// result is the succeeded Refund.
	Refund *engine.Operation[RefundInput, RefundState, Refund]
	// RefundVersions are the defined versions of the refund operation, by
	// version; Refund is one of them.
	RefundVersions map[int]*engine.Operation[RefundInput, RefundState, Refund]
	// ProviderEvent is the operation that applied a provider's webhook event
	// before the demo's endpoint recorded events itself: registered only so
	// that those a database holds unfinished still finish (see
	// ProviderEventOperation). No event starts one.
	ProviderEvent *engine.Operation[ProviderEventInput, ProviderEventState, ProviderEventResult]
	// Settlement moves a client's whole merchant balance to the payout account
	// of a slot, once per (client, slot) (see the package documentation,
	// "Settlements").
	Settlement *engine.Operation[SettlementInput, SettlementState, Settlement]

	provider Provider
	q        *refunddb.Queries
	// engine, once Bind has set it, is what provider events are checked
	// against the books with.
	engine atomic.Pointer[engine.Engine]
}

// Bind gives the workflows the engine that runs them, which
// RecordProviderEvent needs to check a provider's event against the books at
// once (and the provider event operations started before, to settle a refund
// that waits for their event). Call it once engine.New has made the engine,
// before its workers start. Without it, an event's mismatch is found by the
// next reconciliation run.
func (w *Workflows) Bind(e *engine.Engine) {
	w.engine.Store(e)
}

// New declares the order and refund operations, with refunds asked of provider.
// cfg may be nil.
// defaultProviderSettle is the engine's default outcome window (see
// engine.ExternalStepDef.Window).
const defaultProviderSettle = 5 * time.Minute

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
	if w.ProviderEvent, err = w.newProviderEvent(opts); err != nil {
		return nil, fmt.Errorf("refund: %w", err)
	}
	if w.Settlement, err = w.newSettlement(opts); err != nil {
		return nil, fmt.Errorf("refund: %w", err)
	}
	versions := cfg.RefundVersions
	if len(versions) == 0 {
		versions = []int{RefundV1}
	}
	settle := cfg.ProviderSettle
	if settle <= 0 {
		settle = defaultProviderSettle
	}
	approval, err := cfg.approvalPolicy()
	if err != nil {
		return nil, err
	}
	w.RefundVersions = make(map[int]*engine.Operation[RefundInput, RefundState, Refund], len(versions))
	for _, v := range versions {
		steps := []engine.Step[RefundInput, RefundState]{
			engine.TxStep(StepLedger, w.ledger).Compensate(w.reverseLedger),
			engine.ExternalStep(StepProvider, w.callProvider).Lookup(w.lookupProvider).Window(settle).Timeout(cfg.ProviderTimeout).
				FromReference(resolveProvider).Compare(reconcileProvider).Records(ProviderSource, providerReference),
			engine.TxStep(StepFinalize, w.finalize),
		}
		switch v {
		case RefundV1:
		case RefundV2:
			steps = append(steps, engine.TxStep(StepReceipt, w.receipt))
		case RefundV3:
			steps = slices.Insert(steps, 1, engine.Step[RefundInput, RefundState](
				engine.ApprovalStep(StepApproval, approval).Codes(CodeRefundRejected, CodeApprovalExpired)))
			steps = append(steps, engine.TxStep(StepReceipt, w.receipt))
		default:
			return nil, fmt.Errorf("refund: no version %d of the refund operation (there are 1, 2 and 3)", v)
		}
		if _, dup := w.RefundVersions[v]; dup {
			return nil, fmt.Errorf("refund: version %d given twice", v)
		}
		vopts := *opts
		vopts.Version = v
		op, err := engine.NewOperation(RefundOperation, steps, refundResult, &vopts)
		if err != nil {
			return nil, fmt.Errorf("refund: %w", err)
		}
		w.RefundVersions[v] = op
		if w.Refund == nil || v > w.Refund.Version() {
			w.Refund = op
		}
	}
	return w, nil
}

// approvalPolicy checks the approval settings, and returns the policy of the
// approval step of version 3 from them.
func (c *Config) approvalPolicy() (func(RefundInput, *RefundState) engine.ApprovalPolicy, error) {
	switch {
	case c.ApprovalThreshold < 0:
		return nil, fmt.Errorf("refund: ApprovalThreshold %d is negative (0: every refund of version 3 waits for approval)", c.ApprovalThreshold)
	case c.Approvals < 0:
		return nil, fmt.Errorf("refund: Approvals %d is negative", c.Approvals)
	case c.ApprovalTimeout < 0:
		return nil, fmt.Errorf("refund: ApprovalTimeout %s is negative", c.ApprovalTimeout)
	}
	threshold, need, timeout := c.ApprovalThreshold, c.Approvals, c.ApprovalTimeout
	if need == 0 {
		need = DefaultApprovals
	}
	if timeout == 0 {
		timeout = DefaultApprovalTimeout
	}
	return func(in RefundInput, _ *RefundState) engine.ApprovalPolicy {
		if in.Amount < threshold {
			return engine.ApprovalPolicy{}
		}
		return engine.ApprovalPolicy{Need: need, Expires: engine.Deadline{After: timeout}}
	}, nil
}

// Operations returns the order operation, every defined version of the
// refund operation, the provider event operation (for those started before,
// see ProviderEventOperation) and the settlement operation, for
// engine.Config.Operations.
func (w *Workflows) Operations() []engine.Definition {
	defs := []engine.Definition{w.Order, w.ProviderEvent, w.Settlement}
	for _, v := range slices.Sorted(maps.Keys(w.RefundVersions)) {
		defs = append(defs, w.RefundVersions[v])
	}
	return defs
}

// newID returns prefix followed by 26 random base32 characters.
func newID(prefix string) string {
	return prefix + rand.Text()
}
