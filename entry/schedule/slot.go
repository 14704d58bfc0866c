package schedule

import (
	"errors"
	"fmt"
	"time"
)

// KeyPrefix starts every key that Key makes. It ends in a space, which no key
// sent through idempotency.Handler can hold (its keys are visible ASCII, 0x21
// to 0x7E), so no client's key ever meets a slot's.
const KeyPrefix = "schedule "

// ErrNotSlot is returned by Fire and Runner.FireSlot for a time that cannot
// be a slot: the zero time, or one with a fraction of a second (a slot is the
// start of a period, as Slot returns it, and Key keeps whole seconds); and by
// FireSlot for one that does not start a period of the Runner's.
var ErrNotSlot = errors.New("not a slot")

// ErrSlotExpired is returned by Runner.FireSlot for a slot whose operations
// the engine's retention may have deleted: fired again, it could run again.
var ErrSlotExpired = errors.New("slot older than the retention")

// skewMargin is how much earlier than a retention after its start a slot is
// taken as expired: the clocks of the processes and the database's differ.
func skewMargin(retention time.Duration) time.Duration {
	return min(retention/10, time.Minute)
}

// Slot returns the start of the period of length period that holds t, in UTC:
// t truncated to a multiple of period counted from Go's zero time (January 1
// of year 1, 00:00 UTC, a Monday), without a monotonic clock reading. Every
// process computes the same slot for the same instant, whatever its time zone,
// and daylight saving time plays no part. A period that divides 24 hours
// starts its slots at midnight UTC and every period after; a week's slots
// start on Mondays at 00:00 UTC. Calendar months are not a duration: compute
// such a slot yourself (time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)) and give it
// to Fire.
//
// Slot panics when period is not a positive whole number of seconds, as
// time.NewTicker panics for a non-positive interval: Key keeps seconds only.
func Slot(t time.Time, period time.Duration) time.Time {
	if err := checkPeriod(period); err != nil {
		panic("schedule: " + err.Error())
	}
	return t.Truncate(period).UTC()
}

// Key returns the idempotency key of the slot of the operation type named
// name: KeyPrefix, the name, a space and the slot in UTC as RFC 3339 with
// whole seconds, such as "schedule statement 2026-12-01T10:00:00Z". The name
// is part of it because keys are unique per scope, not per operation type:
// two scheduled operation types of one scope must not share the keys of their
// slots. The version is not: an operation type's versions share their slots.
// Engine.GetByKey(ctx, scope, Key(op.Name(), slot)) reads a slot's operation.
func Key(name string, slot time.Time) string {
	return KeyPrefix + name + " " + slot.UTC().Format(time.RFC3339)
}

// checkSlot says whether slot can be a slot (see ErrNotSlot).
func checkSlot(slot time.Time) error {
	switch {
	case slot.IsZero():
		return fmt.Errorf("schedule: %w: the zero time", ErrNotSlot)
	case slot.Nanosecond() != 0:
		return fmt.Errorf("schedule: %w: %s has a fraction of a second", ErrNotSlot, slot.UTC().Format(time.RFC3339Nano))
	}
	return nil
}

func checkPeriod(period time.Duration) error {
	if period <= 0 || period%time.Second != 0 {
		return fmt.Errorf("the period must be a positive whole number of seconds, not %s", period)
	}
	return nil
}
