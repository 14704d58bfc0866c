package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

// RetryOpts are the optional parts of a Retry.
type RetryOpts struct {
	// Force reopens an operation that ended failed with a server fault (a step
	// out of attempts, a failed compensation or result function): its client
	// was told, and the key goes on replaying that answer (Info.PriorError)
	// until the reopened operation finishes again. Without it such an
	// operation is final (ErrFinal).
	Force bool
	// Reason says why, for the audit trail.
	Reason string
}

// Retry gives an operation that needs an operator another run, for an
// operator who has mended the cause: a parked operation, or, with
// opts.Force, one that failed with a server fault. It is in progress again,
// no longer needing attention, and a River job runs it. A failed operation,
// or one parked on its way forward, goes forward: its failed, compensated
// and retrying steps run again (external ones with the same derived keys,
// asking their lookups first), its succeeded steps stay done, and its stored
// answer is replaced by the new run's. An operation parked while it was
// compensating (a compensation failed for good) goes on compensating: its
// error stays, and its compensations get their attempts again. An operation
// in progress that needs attention but is not parked (a step retried past
// its point of no return, or waiting for its outcome past its outcome window)
// runs again at once, from where it is. opts may be nil.
//
// A told answer is final: it returns ErrFinal, changing nothing, for an
// operation that ended with a business answer (Fail) or an operator's cancel,
// and for one that ended with a server fault unless opts.Force. It returns
// ErrNotFailed when the operation is in progress and needs no operator, ErrRunning
// when a live run holds it (an operator's cancel), and ErrCompensated,
// changing nothing, when it would go forward although a step that calls out
// was compensated: run again under the same derived key, that call would be
// answered with the one that was undone, and the step would read as done.
// Such an operation is over; a new one, under a new key, asks again. Done,
// it returns the operation as Get does.
func (e *Engine) Retry(ctx context.Context, id uuid.UUID, opts *RetryOpts) (*Info, error) {
	o := RetryOpts{}
	if opts != nil {
		o = *opts
	}
	err := e.reopen(ctx, id, o.Force)
	err = e.audit(ctx, store.OperatorRequest{OperationID: id, Action: string(ActionRetry), Reason: o.Reason, Force: o.Force}, "reopened; it runs again", err)
	if err != nil {
		return nil, err
	}
	return e.Get(ctx, id)
}

func (e *Engine) reopen(ctx context.Context, id uuid.UUID, force bool) error {
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("engine: retry: %w", err)
	}
	defer rollback(ctx, tx)
	rec, err := e.store.OperationGetForUpdate(ctx, tx, id)
	if err != nil {
		return mapNotFound(err)
	}
	if rec.State == store.OperationFailed {
		pe := storedError(rec.Error)
		switch {
		case pe.Code == CodeCancelled:
			return fmt.Errorf("engine: retry %s: %w: an operator cancelled it", id, ErrFinal)
		case !pe.ServerFault():
			return fmt.Errorf("engine: retry %s: %w: it ended with the answer %s", id, ErrFinal, pe.Code)
		case !force:
			return fmt.Errorf("engine: retry %s: %w: it ended with a server fault (%s), which only a forced retry reopens", id, ErrFinal, pe.Code)
		}
	}
	if rec.State == store.OperationInProgress && !rec.Parked {
		return e.runNow(ctx, tx, rec)
	}
	compensating := rec.State == store.OperationInProgress && len(rec.Error) > 0
	if !compensating {
		steps, err := e.store.StepListByOperation(ctx, tx, id)
		if err != nil {
			return fmt.Errorf("engine: retry: %w", err)
		}
		if name := e.compensatedCall(rec, steps); name != "" {
			return fmt.Errorf("engine: retry %s: %w: step %s", id, ErrCompensated, name)
		}
	}
	ok, err := e.store.OperationReopen(ctx, tx, id, e.cfg.Lease, compensating, rec.State == store.OperationFailed)
	if err != nil {
		return fmt.Errorf("engine: retry: %w", err)
	}
	if !ok && rec.LockedBy != nil && (rec.State == store.OperationFailed || rec.Parked) {
		// A cancel holds it, and is compensating.
		return fmt.Errorf("engine: retry %s: %w", id, ErrRunning)
	}
	if !ok {
		return fmt.Errorf("engine: retry %s: %w (it is %s)", id, ErrNotFailed, rec.State)
	}
	if err := e.enqueueResume(ctx, tx, resumeArgs{OperationID: id, Operation: rec.Name, Scope: rec.Scope}, time.Time{}); err != nil {
		return fmt.Errorf("engine: retry: enqueue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("engine: retry: %w", err)
	}
	msg := "operation reopened by an operator"
	if compensating {
		msg = "operation reopened by an operator; it goes on compensating"
	}
	e.logger.InfoContext(ctx, msg, slog.String("operation_id", id.String()), slog.String("operation", rec.Name))
	return nil
}

// runNow is Retry of an operation in progress that is not parked: one that
// needs attention (a step retried past its point of no return, a step that
// waits for its outcome past its outcome window) runs again at once, from
// where it is, in a River job: a waiting step asks its lookup, and sends
// nothing. One that does not need attention is refused (ErrNotFailed), and so
// is one that a live run holds (ErrRunning). tx is committed.
func (e *Engine) runNow(ctx context.Context, tx pgx.Tx, rec *store.Operation) error {
	if rec.AttentionCode == "" {
		return fmt.Errorf("engine: retry %s: %w (it is in progress and needs no operator)", rec.ID, ErrNotFailed)
	}
	if rec.LockedBy != nil && rec.LockedUntil.After(time.Now()) {
		return fmt.Errorf("engine: retry %s: %w", rec.ID, ErrRunning)
	}
	if err := e.wake(ctx, tx, rec); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("engine: retry: %w", err)
	}
	e.logger.InfoContext(ctx, "operation run again at once by an operator", slog.String("operation_id", rec.ID.String()), slog.String("operation", rec.Name))
	return nil
}

// compensatedCall returns the first compensated step of rec that calls out,
// or that this process cannot tell does not (its definition lacks it): "" when
// there is none.
func (e *Engine) compensatedCall(rec *store.Operation, steps []store.Step) string {
	def := e.def(rec.Name, rec.Version)
	for _, st := range steps {
		if st.State != store.StepCompensated {
			continue
		}
		if def == nil {
			return st.Name
		}
		i, ok := def.index[st.Name]
		if !ok || def.steps[i].kind == StepKindExternal {
			return st.Name
		}
	}
	return ""
}

// ListOpts select the operations that List returns; zero fields select all.
type ListOpts struct {
	// Status keeps operations in this status.
	Status Status
	// Name keeps operations of this type, Scope those of this client scope.
	Name  string
	Scope string
	// OlderThan keeps operations created longer ago than this.
	OlderThan time.Duration
	// NeedsAttention keeps the operations that need attention
	// (Info.NeedsAttention): finished ones a reconciliation mismatch names too.
	NeedsAttention bool
	// After pages on after this operation of a previous page (its last).
	After *Info
	// Max bounds the page; zero means 100.
	Max int
}

// List returns operations, newest first, without their steps: for operators.
// opts may be nil.
func (e *Engine) List(ctx context.Context, opts *ListOpts) ([]*Info, error) {
	o := ListOpts{}
	if opts != nil {
		o = *opts
	}
	if o.Max <= 0 {
		o.Max = 100
	}
	f := store.OperationFilter{
		State: store.OperationState(o.Status), Name: o.Name, Scope: o.Scope,
		NeedsAttention: o.NeedsAttention, Max: o.Max,
	}
	if o.OlderThan > 0 {
		before := time.Now().Add(-o.OlderThan)
		f.CreatedBefore = &before
	}
	if o.After != nil {
		f.After = &store.OperationCursor{CreatedAt: o.After.CreatedAt, ID: o.After.ID}
	}
	recs, err := e.store.OperationList(ctx, e.pool, f)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	out := make([]*Info, len(recs))
	for i, rec := range recs {
		out[i] = infoFromRecord(rec)
	}
	return out, nil
}
