package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

// begin makes the run's next transaction, which sends nothing yet. It is
// fenced by the run, so that nothing it writes commits once another run holds
// the operation: on a first attempt whose reservation has not committed, the
// reservation goes first and is the fence; else OperationFence does, which
// also keeps another run's claim waiting until the transaction ends.
func (r *run) begin(ctx context.Context) *txn {
	tx := r.beginLast(ctx)
	if r.insert == nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationFence(ctx, tx.queue(), r.id, r.runID)
	}
	return tx
}

// beginStep is begin for the transaction of a step or a compensation, whose
// statements may wait on the application's locks: its fence goes with COMMIT,
// so that the row lock it takes does not keep the run's own lease renewals
// waiting meanwhile. It fences all the same: a claim by another run that
// committed first fails it, one that comes later waits for its commit.
func (r *run) beginStep(ctx context.Context) *txn {
	tx := r.beginLast(ctx)
	tx.fenceAtCommit = r.insert == nil
	return tx
}

// beginLast is begin for a transaction that ends the operation with its
// result: the statement that does (OperationFinish) is the fence.
func (r *run) beginLast(ctx context.Context) *txn {
	tx := newTxn(r.e.pool, r.e.cfg.AcquireTimeout, r.e.group)
	if r.insert != nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationReserve(ctx, tx.queue(), *r.insert)
	}
	return tx
}

// runError turns the errors that the engine's statements raise on purpose into
// the run's reasons to stop.
func runError(err error) error {
	switch {
	case errors.Is(err, store.ErrKeyTaken):
		return errKeyTaken
	case errors.Is(err, store.ErrFenced):
		return errLost
	}
	return err
}

// commit writes the pending checkpoints and commits.
func (r *run) commit(ctx context.Context, tx *txn) error {
	return r.commitEnd(ctx, tx, nil)
}

// commitEnd writes the pending checkpoints, ends the operation as end says (nil:
// it goes on), and commits, all in one round trip.
func (r *run) commitEnd(ctx context.Context, tx *txn, end *store.StepCheckpointManyParams) error {
	last := &pgx.Batch{}
	if tx.fenceAtCommit && end == nil {
		// Only queued: it cannot fail here.
		_ = r.e.store.OperationFence(ctx, store.Queue{Batch: last}, r.id, r.runID)
	}
	if end == nil && r.carryCheckpoints(ctx, tx) {
		// The reservation records them.
	} else if end != nil || len(r.pending) > 0 {
		p := store.StepCheckpointManyParams{}
		if end != nil {
			p = *end
		}
		p.OperationID, p.Steps, p.Run = r.id, r.pending, r.runID
		// Only queued: it cannot fail here.
		_ = r.e.store.StepCheckpointMany(ctx, store.Queue{Batch: last}, p)
	}
	if err := tx.commit(ctx, last); err != nil {
		return runError(err)
	}
	r.pending = r.pending[:0]
	if r.insert != nil {
		r.insert = nil
		r.mu.Lock()
		r.reserved = true
		r.reservedAt = time.Now()
		r.leaseFrom = tx.firstSent
		if r.local != nil {
			r.tellReserved()
		}
		r.mu.Unlock()
		r.observeStarted(ctx)
	}
	return nil
}

// carryCheckpoints has the reservation of a first attempt's transaction record
// the pending checkpoints, when nothing of the transaction has been sent yet:
// the operation's row is then written once, with them, rather than inserted
// then updated. It reports whether it did.
func (r *run) carryCheckpoints(ctx context.Context, tx *txn) bool {
	if r.insert == nil || tx.tx != nil || len(r.pending) == 0 || tx.prelude.Len() != 1 {
		return false
	}
	for _, p := range r.pending {
		if p.Retried {
			return false
		}
	}
	ins := *r.insert
	ins.Checkpoints = r.pending
	tx.prelude = &pgx.Batch{}
	// Only queued: it cannot fail here.
	_ = r.e.store.OperationReserve(ctx, tx.queue(), ins)
	return true
}

// commitSuccess stores the result with the pending checkpoints and commits.
// When the result function fails it rolls back and returns a *resultError: the
// caller undoes what the transaction carried of its own, then calls
// resultFailed.
func (r *run) commitSuccess(ctx context.Context, tx *txn) (*Info, error) {
	var result []byte
	err := protect(func() error {
		var err error
		result, err = r.def.result(r.in, r.state)
		return err
	})
	if err != nil {
		tx.end(ctx)
		return nil, &resultError{err: err}
	}
	return r.finish(ctx, tx, store.OperationSucceeded, result, nil)
}

// resultError is the error of the operation's result function.
type resultError struct {
	err error
}

func (r *run) commitFailure(ctx context.Context, tx *txn) (*Info, error) {
	raw, err := json.Marshal(r.failure.stored())
	if err != nil {
		return nil, fmt.Errorf("engine: encode error: %w", err)
	}
	return r.finish(ctx, tx, store.OperationFailed, nil, raw)
}

func (r *run) finish(ctx context.Context, tx *txn, state store.OperationState, result, errRaw []byte) (*Info, error) {
	end := &store.StepCheckpointManyParams{Finish: true, State: state, Result: result, Error: errRaw, Retention: r.e.retention(r.def), Finished: &store.Finished{}}
	if err := r.commitEnd(ctx, tx, end); err != nil {
		return nil, err
	}
	// What Get would read of the row: the times from the statement that
	// finished it, the answer as stored.
	finishedAt := end.Finished.FinishedAt
	info := &Info{
		ID:          r.id,
		Name:        r.def.name,
		Version:     r.def.version,
		Scope:       r.scope,
		Key:         r.key,
		Status:      Status(state),
		Fingerprint: r.fp,
		Result:      result,
		Runs:        r.runs,
		CreatedAt:   end.Finished.CreatedAt,
		FinishedAt:  &finishedAt,
	}
	if state == store.OperationFailed {
		info.Error = r.failure.stored()
	}
	return info, nil
}

// rollback ends a transaction that may already have ended; its error says nothing
// the caller does not know already.
func rollback(ctx context.Context, tx pgx.Tx) {
	_ = tx.Rollback(context.WithoutCancel(ctx))
}

func (e *resultError) Error() string { return "result: " + e.err.Error() }

func (e *resultError) Unwrap() error { return e.err }
