package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/store"
)

// ReopenOpts are the optional parts of a Reopen.
type ReopenOpts struct {
	// Force reopens an operation that ended failed with a server fault (a step
	// out of attempts, a failed compensation or result function): its client
	// was told, and the key goes on replaying that answer (Info.PriorError)
	// until the reopened operation finishes again. Without it such an
	// operation is final (ErrFinal).
	Force bool
	// Reason says why, for the audit trail.
	Reason string
}

// Reopen gives an operation that needs an operator another run, for an
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
// its point of no return, or waiting for its outcome past its settle window)
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
// Such an operation is over; a new one, under a new key, asks again.
func (e *Engine) Reopen(ctx context.Context, id uuid.UUID, opts *ReopenOpts) error {
	o := ReopenOpts{}
	if opts != nil {
		o = *opts
	}
	err := e.reopen(ctx, id, o.Force)
	e.audit(ctx, store.OperatorRequest{OperationID: id, Action: ActionRetry, Reason: o.Reason, Force: o.Force}, "reopened; it runs again", err)
	return err
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
	if _, err := e.river.InsertTx(ctx, tx, resumeArgs{OperationID: id, Operation: rec.Name}, &river.InsertOpts{Queue: e.cfg.Queue}); err != nil {
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

// runNow is Reopen of an operation in progress that is not parked: one that
// needs attention (a step retried past its point of no return, a step that
// waits for its outcome past its settle window) runs again at once, from
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
	if err := e.wake(ctx, tx, rec, nil); err != nil {
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

// Cancel ends an operation in progress that no live run holds (it waits for a
// retry, it is parked, or its process died): the compensations of its succeeded
// steps run, last first, and it ends failed with code CodeCancelled, the reason
// as the operators' cause. It returns ErrRunning when a live run holds the
// operation (try again once its lease expires), ErrFinished when it has
// finished, and ErrPastPivot, changing nothing, when a step that cannot be
// undone has succeeded or may have: the first unfinished step's lookup is
// asked, by derived key, before anything is undone. Silence is no answer: an
// *OutcomeUnknownError (ErrOutcomeUnknown), changing nothing, refuses an
// operation whose external step's last request may still land (its settle
// window has not passed since it was sent, or since the lease of a run that
// may have been sending it), whose call the outside service has pending, or
// whose lookup cannot answer. An operation whose input or
// state does not decode is cancelled only when nothing is to be compensated or
// looked up; else Cancel says so and changes nothing.
func (e *Engine) Cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	info, err := e.cancel(ctx, id, reason)
	detail := ""
	if info != nil {
		detail = "cancelled: " + string(info.Status)
	}
	if reason == "" {
		reason = defaultCancelReason
	}
	e.audit(ctx, store.OperatorRequest{OperationID: id, Action: ActionCancel, Reason: reason}, detail, err)
	return info, err
}

func (e *Engine) cancel(ctx context.Context, id uuid.UUID, reason string) (*Info, error) {
	rec, err := e.store.OperationGet(ctx, e.pool, id)
	if err != nil {
		return nil, mapNotFound(err)
	}
	if rec.State != store.OperationInProgress {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, ErrFinished)
	}
	if reason == "" {
		reason = defaultCancelReason
	}
	if def := e.def(rec.Name, rec.Version); def != nil {
		// Refused whoever holds it: a live run too only goes forward from here.
		steps, err := e.store.StepListByOperation(ctx, e.pool, id)
		if err != nil {
			return nil, fmt.Errorf("engine: cancel %s: %w", id, err)
		}
		for _, st := range steps {
			if st.State == store.StepSucceeded && def.cannotUndo(st.Name) {
				return nil, fmt.Errorf("engine: cancel %s: %w: step %s cannot be undone and has succeeded", id, ErrPastPivot, st.Name)
			}
		}
	}
	cancelled := &PermanentError{Code: CodeCancelled, Message: "the operation was cancelled by an operator", Cause: reason}
	req := operatorClaim(rec)
	req.err = cancelled
	info, err := e.claimAndRun(ctx, id, rec.Name, req, false)
	if errors.Is(err, errNotClaimed) {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, ErrRunning)
	}
	if errors.Is(err, ErrPastPivot) || errors.Is(err, errCannotCancel) || errors.Is(err, ErrOutcomeUnknown) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("engine: cancel %s: %w", id, err)
	}
	return info, nil
}

// defaultCancelReason is a cancel's reason when the operator gives none.
const defaultCancelReason = "cancelled by an operator"

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

// Retention bounds: each batch deletes at most retentionBatch operations within
// retentionBatchTimeout, so that the job never holds locks for long.
const (
	retentionBatch        = 1000
	retentionBatchTimeout = 5 * time.Second
)

// retention is how long an operation of def is kept once it finished.
func (e *Engine) retention(def *opDef) time.Duration {
	if def.retention > 0 {
		return def.retention
	}
	return e.cfg.Retention
}

// DeleteFinished deletes the finished operations whose retention has passed
// before now (nil: the database's clock, as the retention job uses), in
// batches, and returns how many it deleted. An operation's retention is the
// one of the process that finished it (its OperationOpts.Retention, else
// Config.Retention), stored with it then: a later deploy that shortens the
// retention, or a process that does not run the type, never frees its key
// early. Operations that finished before store migration 00009 have none
// stored, and go by this process's retention for their type (its
// Config.Retention for a type it does not run). Operations in progress are
// never deleted; rows of the application that name an operation are not
// touched. A key whose operation was deleted is free: a request that uses it
// again starts a new operation. The retention job calls it; tests and
// operators may too.
func (e *Engine) DeleteFinished(ctx context.Context, now *time.Time) (int, error) {
	total, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Expired: true})
	if err != nil {
		return total, err
	}
	var own []string
	for name, versions := range e.versions {
		// One retention per name: the longest of its versions', so that no
		// version's operations go before their time.
		var retention time.Duration
		for _, v := range versions {
			retention = max(retention, e.def(name, int(v)).retention)
		}
		if retention == 0 {
			continue
		}
		own = append(own, name)
		n, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Retention: retention, Name: name})
		total += n
		if err != nil {
			return total, err
		}
	}
	n, err := e.deleteFinished(ctx, store.OperationDeleteFinishedParams{Now: now, Retention: e.cfg.Retention, Exclude: own})
	return total + n, err
}

func (e *Engine) deleteFinished(ctx context.Context, p store.OperationDeleteFinishedParams) (int, error) {
	p.Max, p.Timeout = retentionBatch, retentionBatchTimeout
	total := 0
	for {
		n, err := e.store.OperationDeleteFinished(ctx, e.control, p)
		total += n
		if err != nil {
			return total, fmt.Errorf("engine: %w", err)
		}
		if n < p.Max {
			return total, nil
		}
	}
}

// retentionArgs is the periodic job that deletes expired operations.
type retentionArgs struct{}

// Kind implements river.JobArgs.
func (retentionArgs) Kind() string { return "idemflow_retention" }

type retentionWorker struct {
	river.WorkerDefaults[retentionArgs]
	e *Engine
}

// Work deletes the operations whose retention has passed.
func (w *retentionWorker) Work(ctx context.Context, job *river.Job[retentionArgs]) error {
	n, err := w.e.DeleteFinished(ctx, nil)
	if n > 0 {
		w.e.logger.InfoContext(ctx, "deleted finished operations past their retention", slog.Int("deleted", n))
	}
	return err
}
