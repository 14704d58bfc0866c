// Package faults is the engine's point of fault injection, for tests and the
// demo: the moments of a step's attempt at which a hook is called (Point),
// what the hook is told (Event), and the hooks (Config, the engine's
// Config.Faults). Package idemflowtest gives these names to a service's tests.
package faults

import (
	"context"

	"github.com/google/uuid"
)

// Point names a moment in a step's attempt, or in its compensation's, at which
// the engine's Config.Faults.Hook is called.
type Point string

// Event describes the moment at which a Hook is called.
type Event struct {
	Operation   string
	OperationID uuid.UUID
	Step        string
	Point       Point
	// Attempt counts the attempts of the step, from 1.
	Attempt int
	// Resumed is true in a run that resumes the operation (a retry or a recovery),
	// false in its first attempt.
	Resumed bool
}

// Hook is called at each Point of every step attempt. It exists for fault
// injection: the demo uses it to crash the process at a chosen point, and to
// make steps fail or panic. An error it returns fails the attempt as the step's
// own error would, and a panic in it is contained as a step's is.
type Hook func(ctx context.Context, ev Event) error

// The points of a step's attempt and of its compensation's.
const (
	// PointBefore is just before the step's function runs.
	PointBefore Point = "before"
	// PointAfterEffect is after the step's function returned successfully and
	// before its checkpoint commits: an external step's call has happened; a
	// transactional step's writes are sent but not committed (those it queued
	// with AtCommit are not even sent: they go with the commit).
	PointAfterEffect Point = "after-effect"
	// PointBeforeCompensation is just before a succeeded step's compensation
	// runs (Attempt counts the compensation's attempts).
	PointBeforeCompensation Point = "before-compensation"
	// PointAfterCompensation is after the compensation returned successfully
	// and before it commits.
	PointAfterCompensation Point = "after-compensation"
	// PointLookup: an external step's lookup has answered (Config.Lookup only).
	PointLookup Point = "lookup"
)

// Config holds the engine's hooks (its Config.Faults).
type Config struct {
	// Hook, when set, is called at each Point of every step attempt: to crash
	// the process there, or to make the attempt fail or panic.
	Hook Hook
	// Lookup, when set, is given every answer of an external step's lookup
	// (ev.Point is PointLookup) and returns the answer the engine acts on: to
	// make a call land late (found, hidden until later) or stay pending for a
	// while (an error matching errAccepted).
	Lookup func(ctx context.Context, ev Event, found bool, err error) (bool, error)
	// GroupSenders, when positive, is how many groups of commits (or lone
	// transactions) the engine has in flight before it queues the next
	// (engine.Config.GroupCommit): 1 makes groups of two operations that
	// commit at once, for tests that want groups without the load.
	GroupSenders int
}
