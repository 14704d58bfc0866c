package engine

import (
	"context"
	"errors"
	"time"

	"github.com/idemflow/idemflow/internal/faults"
)

func (r *run) runTxStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	attempt := r.tries[st.name] + 1
	started := time.Now()
	ctx = r.startStep(ctx, st, attempt)
	var tx *txn
	if last {
		tx = r.beginLast(ctx)
	} else {
		tx = r.beginStep(ctx)
	}
	defer tx.end(ctx)
	err := protect(func() error {
		if err := r.hook(ctx, st, faults.PointBefore, attempt); err != nil {
			return err
		}
		return st.tx(ctx, tx, r.attempt(st, attempt), r.in, r.state)
	})
	if tx.failed != nil {
		// The engine's own statements sent with the step's failed: the step's
		// error says nothing about the step.
		return nil, runError(tx.failed)
	}
	if err == nil {
		err = protect(func() error { return r.hook(ctx, st, faults.PointAfterEffect, attempt) })
	}
	if err != nil {
		tx.end(ctx)
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	return r.commitStep(ctx, tx, i, st, attempt, started, last)
}

// commitStep checkpoints a step whose writes tx holds and commits them with
// it (with the result, when it is the last step). A statement the step
// queued with AtCommit that fails, or a result function that fails, rolls
// all of it back: the step did not succeed.
func (r *run) commitStep(ctx context.Context, tx *txn, i int, st *stepDef, attempt int, started time.Time, last bool) (*Info, error) {
	prevState, prevRaw, prevStatus := r.state, r.stateRaw, r.status[st.name]
	// undo takes back what succeeded queued, for a transaction that committed
	// nothing after all.
	undo := func() {
		r.pending = r.pending[:len(r.pending)-1]
		r.state, r.stateRaw, r.status[st.name] = prevState, prevRaw, prevStatus
	}
	if err := r.succeeded(i, st, attempt, started, ""); err != nil {
		// Its writes roll back with the transaction: nothing happened.
		tx.end(ctx)
		return r.parkUndecodable(ctx, err)
	}
	var (
		info *Info
		err  error
	)
	if last {
		info, err = r.commitSuccess(ctx, tx)
	} else {
		err = r.commit(ctx, tx)
	}
	var se *stepError
	var re *resultError
	switch {
	case errors.As(err, &se):
		// A statement the step queued with AtCommit failed: the step did not
		// succeed after all, and nothing of its transaction committed.
		undo()
		return r.stepFailed(ctx, i, st, attempt, started, se.err)
	case errors.As(err, &re):
		// The result function failed, and the step's transaction rolled back
		// with the result: the step's writes never happened, so there is
		// nothing of its own to compensate.
		undo()
		return r.resultFailed(ctx, re.err)
	}
	if err == nil {
		r.observeStep(ctx, st, attempt, started, AttemptSucceeded, nil)
	}
	return info, err
}
