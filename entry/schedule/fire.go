package schedule

import (
	"context"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/engine"
)

// Fire starts the operation of slot for scope, under the slot's key
// (Key(op.Name(), slot)), once: the firing that reserves the key starts the
// operation (Started.Created true) and runs its first attempt in this process,
// as engine.Start does; every later firing, in this process or another, finds
// the key taken and returns the operation that holds it (Created false,
// Started.Existing filled), not an error, whatever that operation's state: a
// slot whose operation failed is not run again by a firing (reopen it with
// Engine.Retry).
//
// in must be derived from scope and slot only, so that every firer, in every
// process, builds the same input: a firing whose input differs from the one
// the slot's operation was started with is refused with the engine's
// *engine.ReusedError (errors.As finds it), naming the fields
// that differ. What changes from firer to firer (a balance, the time of the
// firing) belongs in a step, which reads it once, in the run that holds the
// operation.
//
// slot is the start of the slot's period, as Slot returns it; the zero time
// and a time with a fraction of a second are refused with ErrNotSlot. The
// slot's key lives as long as its operation: once the engine's retention has
// deleted the operation, a firing of the slot starts it again (see the package
// documentation, "Retention").
func Fire[In, S, Out any](ctx context.Context, e *engine.Engine, op *engine.Operation[In, S, Out], scope string, slot time.Time, in In) (*engine.Started, error) {
	if err := checkSlot(slot); err != nil {
		return nil, err
	}
	started, err := engine.Start(ctx, e, op, scope, Key(op.Name(), slot), in, nil)
	if err != nil {
		return nil, fmt.Errorf("schedule: fire %q for scope %q, slot %s: %w", op.Name(), scope, slot.UTC().Format(time.RFC3339), err)
	}
	return started, nil
}
