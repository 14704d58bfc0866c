package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

// AwaitingApproval is an operation whose ApprovalStep waits for approvals
// (Engine.Approvals).
type AwaitingApproval struct {
	OperationID uuid.UUID
	Name        string
	Version     int
	Scope       string
	Key         string
	// Step is the step that waits.
	Step string
	// RequestedAt is when the operation reached it, ExpiresAt when its wait
	// expires (nil: never), both by the database's clock and fixed then.
	RequestedAt time.Time
	ExpiresAt   *time.Time
	// Need is how many distinct actors must approve it; ApprovedBy those who
	// did, in the order they did.
	Need       int
	ApprovedBy []string
}

// Approvals lists at most limit operations whose ApprovalStep waits for
// approvals and is not decided yet (fewer distinct approvals than it needs,
// none rejected: what awaits an operator), the oldest first (limit 0: 100).
func (e *Engine) Approvals(ctx context.Context, limit int) ([]AwaitingApproval, error) {
	if limit <= 0 {
		limit = 100
	}
	list, err := e.store.ApprovalList(ctx, e.pool, limit)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([]AwaitingApproval, len(list))
	for i, a := range list {
		out[i] = AwaitingApproval{OperationID: a.OperationID, Name: a.Name, Version: a.Version, Scope: a.Scope, Key: a.Key,
			Step: a.Step, RequestedAt: a.Since, ExpiresAt: a.Until, Need: a.Need, ApprovedBy: a.ApprovedBy}
	}
	return out, nil
}

// Approve records that the actor of ctx (WithActor) approves the operation
// id, which waits at its ApprovalStep, for reason (required). Once as many
// distinct actors as the step needs approved, the operation goes on; an
// actor who approved it before changes nothing (and is not refused). It
// returns the operation as Get does.
//
// It is refused, changing nothing, with ErrReasonRequired without a reason,
// ErrFinished for an operation that ended, ErrWaitOver once the step's wait
// expired (the operation is made due, to carry the expiry out now if it was
// not yet), and ErrNotAwaitingApproval for one that does not wait for
// approval (not yet, or no more: approved or rejected already). Every
// request, done or refused, is in the operation's audit trail
// (ActionApprove) and told to the Observer.
//
// Approve needs none of the operation's definitions: an Admin's is the same.
func (e *Engine) Approve(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	return e.decide(ctx, id, ActionApprove, reason)
}

// Reject records that the actor of ctx rejects the operation id, which
// waits at its ApprovalStep, for reason (required): the step fails with its
// rejection code, a business failure, and the steps before it are
// compensated. It is refused as Approve is.
func (e *Engine) Reject(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	return e.decide(ctx, id, ActionReject, reason)
}

// decide carries out an approval or a rejection, and audits it.
func (e *Engine) decide(ctx context.Context, id uuid.UUID, action Action, reason string) (*Info, error) {
	detail, over, err := e.approval(ctx, id, action, reason)
	err = e.audit(ctx, store.OperatorRequest{OperationID: id, Action: string(action), Reason: reason}, detail, err)
	if over != nil {
		e.wakeOver(ctx, over)
	}
	if err != nil {
		return nil, err
	}
	return e.Get(ctx, id)
}

// approval records an approval or a rejection, in one transaction that
// locks the operation's row first: a run deciding the step, and the
// requests of other operators, come before it or after it. It returns what
// the audit trail says of it, and the operation when its wait is over.
func (e *Engine) approval(ctx context.Context, id uuid.UUID, action Action, reason string) (string, *store.Operation, error) {
	if reason == "" {
		return "", nil, fmt.Errorf("engine: %s %s: %w", action, id, ErrReasonRequired)
	}
	actor := actorOf(ctx)
	var (
		detail string
		over   *store.Operation
	)
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		rec, err := e.store.OperationGetForUpdate(ctx, tx, id)
		if err != nil {
			return mapNotFound(err)
		}
		if rec.State != store.OperationInProgress {
			return fmt.Errorf("engine: %s %s: %w", action, id, ErrFinished)
		}
		steps, err := e.store.WaitStepFor(ctx, tx, id, signalApprove)
		if err != nil {
			return fmt.Errorf("engine: %s %s: %w", action, id, err)
		}
		i := slices.IndexFunc(steps, func(s store.WaitStep) bool { return s.State == store.StepWaiting })
		if i < 0 {
			if slices.ContainsFunc(steps, func(s store.WaitStep) bool { return s.Expired && s.State != store.StepSucceeded }) {
				return fmt.Errorf("engine: %s %s: %w: its wait for approval expired", action, id, ErrWaitOver)
			}
			return fmt.Errorf("engine: %s %s: %w", action, id, ErrNotAwaitingApproval)
		}
		step := steps[i]
		if step.Expired {
			over = rec
			return fmt.Errorf("engine: %s %s: %w: its wait for approval expired at %s", action, id, ErrWaitOver,
				step.Until.UTC().Format(time.RFC3339))
		}
		signals, err := e.store.SignalList(ctx, tx, id, []string{signalApprove, signalReject})
		if err != nil {
			return fmt.Errorf("engine: %s %s: %w", action, id, err)
		}
		approvers, rejection := approvalOutcome(signals, step.Need)
		if action == ActionApprove && slices.Contains(approvers, actor) {
			detail = fmt.Sprintf("%s approved it before: nothing changed (%d of %d approvals)", actor, len(approvers), step.Need)
			return nil
		}
		switch {
		case rejection != nil:
			return fmt.Errorf("engine: %s %s: %w: %s rejected it", action, id, ErrNotAwaitingApproval, rejection.Actor)
		case len(approvers) >= step.Need:
			return fmt.Errorf("engine: %s %s: %w: it is approved", action, id, ErrNotAwaitingApproval)
		}
		sig := store.Signal{OperationID: id, ID: "approve:" + actor, Name: signalApprove, Actor: actor, Reason: reason}
		decided := len(approvers)+1 >= step.Need
		detail = fmt.Sprintf("approved by %s (%d of %d)", actor, len(approvers)+1, step.Need)
		if action == ActionReject {
			sig.ID, sig.Name, decided = "reject:"+actor, signalReject, true
			detail = "rejected by " + actor
		} else if decided {
			detail += ": it goes on"
		}
		if _, err := e.store.SignalInsert(ctx, tx, sig); err != nil {
			return fmt.Errorf("engine: %s %s: %w", action, id, err)
		}
		if decided {
			return e.wakeWaiting(ctx, tx, rec)
		}
		return nil
	})
	return detail, over, err
}
