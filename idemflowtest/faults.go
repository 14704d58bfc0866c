package idemflowtest

import "github.com/idemflow/idemflow/internal/faults"

// Point names a moment in a step's attempt, or in its compensation's, at which
// the engine calls its fault hook (engine.Config.Faults.Hook): where a Matrix
// run injects its crash or fault (Run.Point).
type Point = faults.Point

// The points of a step's attempt and of its compensation's.
const (
	// PointBefore is just before the step's function runs.
	PointBefore = faults.PointBefore
	// PointAfterEffect is after the step's function returned successfully
	// and before its checkpoint commits.
	PointAfterEffect = faults.PointAfterEffect
	// PointBeforeCompensation is just before a succeeded step's compensation
	// runs.
	PointBeforeCompensation = faults.PointBeforeCompensation
	// PointAfterCompensation is after the compensation returned successfully
	// and before it commits.
	PointAfterCompensation = faults.PointAfterCompensation
	// PointLookup: an external step's lookup has answered
	// (engine.Config.Faults.Lookup only).
	PointLookup = faults.PointLookup
)

// HookEvent is what the engine's fault hooks (engine.Config.Faults) are told:
// the operation, the step, the Point and the attempt. A test that injects
// faults of its own sets the hooks with it:
//
//	cfg.Faults.Hook = func(ctx context.Context, ev idemflowtest.HookEvent) error {
//		if ev.Step == "charge" && ev.Point == idemflowtest.PointAfterEffect {
//			return errors.New("injected: the answer is lost")
//		}
//		return nil
//	}
type HookEvent = faults.Event
