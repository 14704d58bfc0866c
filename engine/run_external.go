package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/store"
)

// attempt describes attempt number n of the step st.
func (r *run) attempt(st *stepDef, n int) Attempt {
	return Attempt{
		Key:          derivedKey(r.id, r.secret, r.def.name, r.scope, r.key, st.name),
		OperationID:  r.id,
		Number:       n,
		Operation:    r.def.name,
		Step:         st.name,
		Scope:        r.scope,
		OperationKey: r.key,
	}
}

// lookup asks st's lookup whether a call made under its derived key went
// through, filling the state when it did. A panic in it is its error.
func (r *run) lookup(ctx context.Context, st *stepDef, at Attempt) (bool, error) {
	found := false
	err := protect(func() error {
		var err error
		found, err = st.lookup(ctx, at, r.in, r.state)
		if test := r.e.cfg.Faults.Lookup; test != nil {
			found, err = test(ctx, faults.Event{Operation: r.def.name, OperationID: r.id, Step: st.name, Point: faults.PointLookup,
				Attempt: at.Number, Resumed: r.resumed}, found, err)
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("lookup: %w", err)
	}
	r.observeLookup(ctx, st, at.Number, found)
	if found {
		r.logger().InfoContext(ctx, "lookup found the earlier attempt; not calling again",
			slog.String("step", st.name), slog.Int("attempt", at.Number))
	}
	return found, nil
}

func (r *run) runExternalStep(ctx context.Context, i int, st *stepDef, last bool) (*Info, error) {
	// The reservation commits before anything leaves the process.
	if r.insert != nil {
		if err := r.commit(ctx, r.begin(ctx)); err != nil {
			return nil, err
		}
	}
	if r.status[st.name] == store.StepWaiting {
		// Out of calls: only its lookup, an event or an operator settles it.
		return r.awaitOutcome(ctx, i, st, time.Now(), last)
	}
	attempt := r.tries[st.name] + 1
	started := time.Now()
	ctx = r.startStep(ctx, st, attempt)
	at := r.attempt(st, attempt)
	resolvedBy := ResolvedByCall
	err := protect(func() error {
		if err := r.hook(ctx, st, faults.PointBefore, attempt); err != nil {
			return err
		}
		// A resumed run cannot know whether the run before it called out: ask first.
		if st.lookup != nil && (r.resumed || attempt > 1) {
			found, err := r.lookup(ctx, st, at)
			if err != nil {
				return err
			}
			if found {
				resolvedBy = ResolvedByLookup
				return nil
			}
		}
		callCtx := ctx
		if st.timeout > 0 {
			var cancel context.CancelFunc
			callCtx, cancel = context.WithTimeout(ctx, st.timeout)
			defer cancel()
		}
		return st.external(callCtx, at, r.in, r.state)
	})
	if err == nil {
		err = protect(func() error { return r.hook(ctx, st, faults.PointAfterEffect, attempt) })
	}
	if err != nil && errors.Is(err, errAccepted) && context.Cause(ctx) == nil {
		return r.pendingOutcome(ctx, i, st, attempt, started, err)
	}
	if err != nil {
		return r.stepFailed(ctx, i, st, attempt, started, err)
	}
	return r.externalSucceeded(ctx, i, st, attempt, started, resolvedBy, last)
}

// externalSucceeded queues the checkpoint of an external step whose call went
// through, and stores the result when it was the last step.
func (r *run) externalSucceeded(ctx context.Context, i int, st *stepDef, attempt int, started time.Time, resolvedBy ResolvedBy, last bool) (*Info, error) {
	if err := r.succeeded(i, st, attempt, started, resolvedBy); err != nil {
		return r.parkUndecodable(ctx, err)
	}
	r.observeStep(ctx, st, attempt, started, AttemptSucceeded, nil)
	if !last {
		// Checkpointed with the next transaction, so that a first attempt commits
		// once before its call and once after.
		return nil, nil
	}
	return r.storeResult(ctx)
}
