package idemflowtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// raceOffsets are the moments, from a wait's deadline, at which the race
// rounds satisfy the wait: around it, where the first to commit wins.
var raceOffsets = []time.Duration{-10 * time.Millisecond, -3 * time.Millisecond, -time.Millisecond, 0,
	time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond}

// ExpiryRaces races each wait of the operation that has a deadline against
// it: an ApprovalStep that expires, or a SignalStep with a Deadline, as the
// run without a crash saw them wait. In each round, two engines on one
// database (two processes' worth: each with its workers and its timer loop)
// run the operation; once it waits at the step, one engine satisfies the
// wait with WaitFunc at the deadline, give or take up to 10ms by this
// process's clock, while the timer loops carry the deadline out. Exactly one
// may win, and the round checks that it did:
//
//   - WaitFunc returned nil: its signal or its approvals were accepted, so the
//     step must have passed (an approval step succeeded; a signal step did not
//     fail with engine.CodeSignalTimeout).
//   - WaitFunc returned engine.ErrWaitOver or engine.ErrFinished: the deadline
//     won, so an approval step must have failed (expired).
//   - Any other answer (engine.ErrNotAwaitingApproval included) breaks the
//     round: a wait whose deadline passed refuses with one of those two.
//
// Besides, the wait must be decided once over both engines
// (engine.Observer.Waited), and Run.Check must find the books right: a
// compensation after the expiry made once. Each round is a subtest of its
// own; a table of them is logged, as Crashes's is.
//
// The deadline should be short (a second or so) for the rounds to be quick,
// and long enough that the operation is seen waiting before it: the kit reads
// the operation every 50ms.
func (m Matrix[In, S, Out]) ExpiryRaces(t *testing.T) {
	t.Helper()
	m.report(t, m.raceResults(t, true), true)
}

// ExpiryRaceResults is ExpiryRaces without failing t for a broken invariant.
func (m Matrix[In, S, Out]) ExpiryRaceResults(t *testing.T) []Result {
	t.Helper()
	return m.raceResults(t, false)
}

func (m Matrix[In, S, Out]) raceResults(t *testing.T, fail bool) []Result {
	t.Helper()
	if os.Getenv(envChild) != "" {
		return nil // a crash matrix's child runs only its own point
	}
	base, points, _ := m.baseline(t)
	type round struct {
		p      point
		offset time.Duration
	}
	var rounds []round
	for _, p := range points {
		if p.Point != pointWaiting || !p.Deadline || (p.Wait != engine.WaitApproval && p.Wait != engine.WaitSignal) {
			continue
		}
		for _, d := range raceOffsets {
			rounds = append(rounds, round{p, d})
		}
	}
	if len(rounds) == 0 {
		t.Fatal("idemflowtest: the operation never waited at a step with a deadline (an approval that expires, a signal with a deadline): nothing to race")
	}
	names := make([]string, len(rounds))
	for i, r := range rounds {
		names[i] = fmt.Sprintf("%s/deadline%+dms", r.p.Step, r.offset.Milliseconds())
	}
	return append([]Result{base}, runPoints(t, "race", names, fail, func(t *testing.T, i int) Result {
		return m.raceAt(t, rounds[i].p, rounds[i].offset)
	})...)
}

// raceAt runs one round of ExpiryRaces: p's wait satisfied at its deadline
// plus offset.
func (m Matrix[In, S, Out]) raceAt(t *testing.T, p point, offset time.Duration) Result {
	t.Helper()
	res := Result{}
	_, pool, run := m.prepare(t, newPlan(t, "", ""))
	decided := &waitCount{step: p.Step}
	a, op := m.engineWith(t, pool, run, nil, nil, decided.observer(), true)
	b, _ := m.engineWith(t, pool, run, nil, nil, decided.observer(), true)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	started, err := engine.Start(ctx, a, op, scope, key, m.input(run.Env), nil)
	if err != nil {
		res.Err = fmt.Errorf("start: %w", err)
		return res
	}
	// a satisfies every wait but p's, which it leaves to the race.
	type waiting struct {
		info *engine.Info
		step engine.StepInfo
	}
	reached := make(chan waiting, 1)
	w := m.waiter(a)
	w.seen = func(info *engine.Info, s engine.StepInfo) bool {
		if s.Name != p.Step {
			return true
		}
		reached <- waiting{info, s}
		return false
	}
	done := make(chan struct{})
	var (
		info *engine.Info
		werr error
	)
	go func() {
		defer close(done)
		info, werr = waitFor(ctx, w, started)
	}()
	var at waiting
	select {
	case at = <-reached:
	case <-done:
		res.Err = fmt.Errorf("the operation ended (%v) without waiting at %s", werr, p.Step)
		return res
	}
	if at.step.Wait.Until == nil {
		res.Err = fmt.Errorf("step %s waits with no deadline", p.Step)
		return res
	}
	timer := time.NewTimer(time.Until(at.step.Wait.Until.Add(offset)))
	select {
	case <-ctx.Done():
		timer.Stop()
		res.Err = ctx.Err()
		return res
	case <-timer.C:
	}
	serr := m.waiter(b).fn(ctx, b, at.info, at.step)
	accepted := serr == nil
	<-done
	if werr != nil {
		res.Err = fmt.Errorf("the operation neither finished nor was parked within %s: %w", waitTimeout, werr)
		return res
	}
	full, err := a.Get(ctx, info.ID)
	if err != nil {
		res.Err = fmt.Errorf("read the operation: %w", err)
		return res
	}
	res.Status, res.Parked = full.Status, full.Parked
	errs := []error{run.Check(ctx, full), decided.check()}
	var step engine.StepInfo
	for _, s := range full.Steps {
		if s.Name == p.Step {
			step = s
		}
	}
	outcome := "accepted"
	switch {
	case accepted && p.Wait == engine.WaitApproval && step.Status != engine.StepStatusSucceeded && step.Status != engine.StepStatusCompensated:
		errs = append(errs, fmt.Errorf("the approvals were accepted, and step %s is %s", p.Step, step.Status))
	case accepted && p.Wait == engine.WaitSignal && full.Error != nil && full.Error.Code == engine.CodeSignalTimeout && full.Error.Step == p.Step:
		errs = append(errs, fmt.Errorf("the signal was accepted, and step %s timed out", p.Step))
	case accepted:
	case errors.Is(serr, engine.ErrWaitOver) || errors.Is(serr, engine.ErrFinished):
		outcome = "refused"
		if p.Wait == engine.WaitApproval && step.Status != engine.StepStatusFailed {
			errs = append(errs, fmt.Errorf("the approval was refused (%w), and step %s is %s", serr, p.Step, step.Status))
		}
	default:
		outcome = "failed"
		errs = append(errs, fmt.Errorf("the WaitFunc at the deadline was neither accepted nor refused as over: %w", serr))
	}
	t.Logf("WaitFunc at the deadline %+v: %s; the operation %s", offset, outcome, full.Status)
	res.Err = errors.Join(errs...)
	return res
}
