package idemflowtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
)

// WaitFunc satisfies a wait of a matrix's operation (Matrix.WaitFunc): the
// kit calls it, with the engine of the process it runs in, once the
// operation info waits at step (a SignalStep, TimerStep or ApprovalStep:
// step.Status is engine.StepStatusWaiting and step.Wait says for what). It
// sends the signal (engine.Engine.Signal), gives the approvals
// (engine.Engine.Approve) or rejects (engine.Engine.Reject), or returns nil
// at once for a timer, which passes by itself. It returns the engine's
// refusal as it is: the kit tells one (engine.ErrWaitOver,
// engine.ErrFinished, engine.ErrNotAwaitingApproval: the wait was decided
// otherwise) from a failure, which fails the run.
//
// It is called once per step in each process that runs the operation: again
// in the process that resumes it after a crash, when the step still waits
// there, with what step.Wait says then (the approvals given before are kept).
type WaitFunc func(ctx context.Context, e *engine.Engine, info *engine.Info, step engine.StepInfo) error

// SatisfyWait is the WaitFunc of a Matrix that gives none: it gives an
// approval step the approvals it lacks, each by a distinct actor
// ("idemflowtest-1", "idemflowtest-2", ...) who has not approved yet, and
// returns nil for a timer. It cannot know a signal's payload: for a signal
// step it returns an error that asks for a WaitFunc.
func SatisfyWait(ctx context.Context, e *engine.Engine, info *engine.Info, step engine.StepInfo) error {
	if step.Wait == nil {
		return nil
	}
	switch step.Wait.Reason {
	case engine.WaitApproval:
		approved := slices.Clone(step.Wait.ApprovedBy)
		for i := 1; len(approved) < step.Wait.Need; i++ {
			actor := "idemflowtest-" + strconv.Itoa(i)
			if slices.Contains(approved, actor) {
				continue
			}
			if _, err := e.Approve(engine.WithActor(ctx, actor), info.ID, "idemflowtest: approved by the matrix"); err != nil {
				return err
			}
			approved = append(approved, actor)
		}
	case engine.WaitSignal:
		return fmt.Errorf("idemflowtest: step %s waits for the signal %q: give the Matrix a WaitFunc that sends it", step.Name, step.Wait.Signal)
	}
	return nil
}

// refused reports whether err is the engine's refusal of a signal or an
// approval because the wait was decided otherwise.
func refused(err error) bool {
	return errors.Is(err, engine.ErrWaitOver) || errors.Is(err, engine.ErrFinished) || errors.Is(err, engine.ErrNotAwaitingApproval)
}

// waitPoll is how often the kit reads an operation that has wait steps, to
// see whether it waits.
const waitPoll = 50 * time.Millisecond

// waiter satisfies the waits of one operation in one process.
type waiter struct {
	e  *engine.Engine
	fn WaitFunc
	// seen, when not nil, is told of each wait step that the operation is
	// first seen waiting at, before fn is called for it; false leaves the
	// step to the caller (fn is not called).
	seen func(info *engine.Info, step engine.StepInfo) bool
}

// waiter returns the waiter of e, with m's WaitFunc or SatisfyWait.
func (m Matrix[In, S, Out]) waiter(e *engine.Engine) *waiter {
	fn := m.WaitFunc
	if fn == nil {
		fn = SatisfyWait
	}
	return &waiter{e: e, fn: fn}
}

// drive reads the operation id every waitPoll until it has finished, is
// parked or ctx ends, and calls fn once for each wait step it sees it
// waiting at. It returns at once when the operation has no wait step, and
// fn's error when it is no refusal (see refused).
func (w *waiter) drive(ctx context.Context, id uuid.UUID) error {
	called := map[string]bool{}
	for known := false; ; {
		info, err := w.e.Get(ctx, id)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, engine.ErrNotFound):
			// Its reservation commits with its first step: not yet.
		case err != nil:
			return fmt.Errorf("idemflowtest: read the operation: %w", err)
		case !known && !slices.ContainsFunc(info.Steps, func(s engine.StepInfo) bool { return s.Kind == engine.StepKindWait }):
			return nil
		case info.Status != engine.StatusInProgress || info.Parked:
			return nil
		default:
			known = true
			for _, s := range info.Steps {
				if s.Kind != engine.StepKindWait || s.Status != engine.StepStatusWaiting || s.Wait == nil || called[s.Name] {
					continue
				}
				called[s.Name] = true
				if w.seen != nil && !w.seen(info, s) {
					continue
				}
				if err := w.fn(ctx, w.e, info, s); err != nil && !refused(err) && ctx.Err() == nil {
					return fmt.Errorf("idemflowtest: the WaitFunc of step %s: %w", s.Name, err)
				}
			}
		}
		t := time.NewTimer(waitPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// waitFor waits for the operation started, and drives its waits with w
// meanwhile. An error of w ends the wait, and is returned.
func waitFor(ctx context.Context, w *waiter, started *engine.Started) (*engine.Info, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	driven := make(chan error, 1)
	go func() {
		err := w.drive(ctx, started.ID)
		if err != nil {
			cancel(err)
		}
		driven <- err
	}()
	info, err := started.Wait(ctx)
	cancel(nil)
	if derr := <-driven; derr != nil {
		return nil, derr
	}
	return info, err
}

// waitCount counts, in the processes whose engines it observes, the
// decisions of the wait of one step (engine.Observer.Waited).
type waitCount struct {
	step string
	mu   sync.Mutex
	n    int
}

func (c *waitCount) observer() *engine.Observer {
	return &engine.Observer{Waited: func(_ context.Context, ev engine.StepEvent, _ engine.WaitReason, _ time.Duration) {
		if ev.Step == c.step {
			c.mu.Lock()
			c.n++
			c.mu.Unlock()
		}
	}}
}

// check returns an error unless the wait was decided once.
func (c *waitCount) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n != 1 {
		return fmt.Errorf("step %s's wait was decided %d times, want once", c.step, c.n)
	}
	return nil
}

// sleepPast sleeps until the moment that the operation's step waits for, a
// little after it, when it is a timer that waits: so that the moment comes
// while no process is up.
func sleepPast(ctx context.Context, e *engine.Engine, step string) error {
	info, err := e.GetByKey(ctx, scope, key)
	if err != nil {
		return fmt.Errorf("read the operation: %w", err)
	}
	for _, s := range info.Steps {
		if s.Name != step || s.Status != engine.StepStatusWaiting || s.Wait == nil || s.Wait.Reason != engine.WaitTimer || s.Wait.Until == nil {
			continue
		}
		t := time.NewTimer(min(time.Until(*s.Wait.Until)+pastMoment, waitTimeout))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// pastMoment is how long after a timer's moment the kit starts the process
// that must carry it out (the database's clock and the test's may differ a
// little).
const pastMoment = 100 * time.Millisecond
