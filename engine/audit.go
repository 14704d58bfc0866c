package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/store"
)

// Action is what an operator asks of an operation, as the audit trail, the
// operators' pages and the idemflow command name it.
type Action string

// The actions of operators.
const (
	// ActionRetry: another run (Engine.Retry).
	ActionRetry Action = "retry"
	// ActionCancel: compensate and fail (Engine.Cancel).
	ActionCancel Action = "cancel"
	// ActionResolve: an operator's word on a call's outcome (Engine.Resolve).
	ActionResolve Action = "resolve"
	// ActionApprove: an approval at an ApprovalStep (Engine.Approve).
	ActionApprove Action = "approve"
	// ActionReject: a rejection at an ApprovalStep (Engine.Reject).
	ActionReject Action = "reject"
)

// AuditEntry is one operator request on an operation: a retry, a cancel, a
// resolve, an approval or a rejection, done or refused, kept with the operation for as long
// as it is.
type AuditEntry struct {
	// At is when the request was carried out, or asked while it waits for a
	// process (Result "pending").
	At time.Time
	// Action is ActionRetry, ActionCancel, ActionResolve, ActionApprove or
	// ActionReject.
	Action Action
	// Actor is who asked (WithActor), Reason why.
	Actor  string
	Reason string
	// Result is "done", "refused" (by rule; nothing changed), "failed" (it
	// could not be carried out, the database did not answer, say) or
	// "pending" (an Admin request no process has carried out yet).
	Result string
	// Refusal, for a refused request, is why: the code its caller was
	// answered with (a *RefusedError's).
	Refusal Refusal
	// Detail says what happened, or why it was refused.
	Detail string
}

type actorKey struct{}

// auditedKey marks a context whose request is recorded already (an Admin
// request that a process carries out): the engine records nothing more.
type auditedKey struct{}

// WithActor returns ctx naming actor as the operator whose requests (Retry,
// Cancel, Resolve, Approve, Reject, and Admin's) are carried with it: what the audit trail
// records. Without it, defaultActor.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorOf(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return defaultActor
}

// audit records an operator's request on operation id and how it ended (err:
// nil when done), unless ctx's request is recorded already or there is no
// such operation. A request that could not be recorded is logged; the
// action stands. It returns err as the request returns it: a refusal as a
// *RefusedError.
func (e *Engine) audit(ctx context.Context, req store.OperatorRequest, detail string, err error) error {
	err = refusedOf(req.OperationID, err)
	if errors.Is(err, ErrNotFound) {
		return err
	}
	req.Actor = actorOf(ctx)
	req.Outcome, req.Message = "done", detail
	if err != nil {
		req.Outcome, req.Message = "failed", err.Error()
		if req.Code = refusalCode(err); req.Code != "" {
			req.Outcome = "refused"
		}
	}
	e.observeOperator(ctx, Action(req.Action), req.Outcome)
	if ctx.Value(auditedKey{}) != nil {
		return err // an Admin request: its own row is the entry
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), existingReadTimeout)
	defer cancel()
	if rerr := e.store.OperatorRequestRecord(rctx, e.control, req); rerr != nil {
		e.logger.ErrorContext(ctx, "could not record an operator's request in the audit trail",
			slog.String("operation_id", req.OperationID.String()), slog.String("action", req.Action),
			slog.String("actor", req.Actor), slog.String("outcome", req.Outcome), slog.Any("error", rerr))
	}
	return err
}

// observeOperator tells the observer of an operator's request carried out
// here, containing its panic.
func (e *Engine) observeOperator(ctx context.Context, action Action, result string) {
	obs := e.cfg.Observer
	if obs == nil || obs.OperatorRequested == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			e.logger.ErrorContext(ctx, "observer panicked; ignored", slog.String("call", "OperatorRequested"), slog.Any("panic", v))
		}
	}()
	obs.OperatorRequested(ctx, action, result)
}

// auditOf reads operation id's audit trail.
func (e *Engine) auditOf(ctx context.Context, id uuid.UUID) ([]AuditEntry, error) {
	reqs, err := e.store.OperatorRequestListByOperation(ctx, e.pool, id)
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, len(reqs))
	for i, r := range reqs {
		a := AuditEntry{At: r.RequestedAt, Action: Action(r.Action), Actor: r.Actor, Reason: r.Reason, Result: "pending", Detail: r.Message}
		if r.DoneAt != nil {
			a.At, a.Result, a.Refusal = *r.DoneAt, r.Outcome, Refusal(r.Code)
		}
		out[i] = a
	}
	return out, nil
}
