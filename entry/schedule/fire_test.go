package schedule_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/schedule"
)

// slot0 is a slot of an hour (and of a minute) two hours ago: within the
// engine's retention, as a slot that Runner.FireSlot fires must be.
var slot0 = schedule.Slot(time.Now(), time.Hour).Add(-2 * time.Hour)

// feeFor is the fee's input for a slot: derived from the slot alone, as
// every firer must derive it.
func feeFor(slot time.Time) feeIn { return feeIn{Slot: slot, Fee: 100 + int64(slot.Hour())} }

// firing is one call of Fire, by process 0 or 1.
type firing struct {
	process int
	scope   string
	slot    time.Time
}

type slotKey struct {
	scope string
	slot  time.Time
}

// times makes n firings of (scope, slot), alternating the processes.
func times(n int, scope string, slot time.Time) []firing {
	out := make([]firing, n)
	for i := range out {
		out[i] = firing{process: i % 2, scope: scope, slot: slot}
	}
	return out
}

func TestFire(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name string
		// concurrent fires them all at once; else one after the other.
		concurrent bool
		firings    []firing
	}{
		{"the same slot 5 times, one after the other", false, times(5, "client-a", slot0)},
		{"the same slot 5 times at once from each of two processes", true, times(10, "client-a", slot0)},
		{"different slots, one after the other", false, []firing{
			{0, "client-a", slot0}, {1, "client-a", slot0.Add(time.Hour)}, {0, "client-a", slot0.Add(2 * time.Hour)},
			{1, "client-a", slot0}, {0, "client-a", slot0.Add(time.Hour)}, {1, "client-a", slot0.Add(2 * time.Hour)},
		}},
		{"different slots and scopes, 5 times each at once", true, append(append(append(
			times(5, "client-a", slot0), times(5, "client-a", slot0.Add(time.Hour))...),
			times(5, "client-b", slot0)...), times(5, "client-b", slot0.Add(time.Hour))...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)

			started := make([]*engine.Started, len(tc.firings))
			errs := make([]error, len(tc.firings))
			fire := func(i int) {
				f := tc.firings[i]
				started[i], errs[i] = schedule.Fire(t.Context(), b.engines[f.process], b.fee, f.scope, f.slot, feeFor(f.slot))
			}
			if tc.concurrent {
				var wg sync.WaitGroup
				gate := make(chan struct{})
				for i := range tc.firings {
					wg.Go(func() { <-gate; fire(i) })
				}
				close(gate)
				wg.Wait()
			} else {
				for i := range tc.firings {
					fire(i)
				}
			}

			created := map[slotKey]int{}
			ids := map[slotKey]map[uuid.UUID]bool{}
			for i, f := range tc.firings {
				require.NoError(t, errs[i], "firing %d", i)
				k := slotKey{f.scope, f.slot}
				if started[i].Created {
					created[k]++
				} else {
					require.NotNil(t, started[i].Existing, "firing %d found the slot's operation", i)
					require.Equal(t, started[i].ID, started[i].Existing.ID)
				}
				if ids[k] == nil {
					ids[k] = map[uuid.UUID]bool{}
				}
				ids[k][started[i].ID] = true
			}
			for k := range ids {
				require.Equal(t, 1, created[k], "one firing of %v started its operation", k)
				require.Len(t, ids[k], 1, "every firing of %v returned the same operation", k)
				info := b.finished(t, b.fee, k.scope, k.slot)
				require.Equal(t, engine.StatusSucceeded, info.Status)
				require.True(t, ids[k][info.ID])
			}

			perSlot := map[slotKey]int{}
			for _, c := range b.charges(t) {
				k := slotKey{c.scope, c.slot}
				perSlot[k]++
				require.Equal(t, feeFor(c.slot).Fee, c.fee)
				require.True(t, ids[k][c.operationID], "the charge is the slot's operation's")
			}
			require.Len(t, perSlot, len(ids), "a charge for every (scope, slot)")
			for k, n := range perSlot {
				require.Equal(t, 1, n, "one charge for %v", k)
			}
			require.Equal(t, len(ids), b.operations(t), "one operation per (scope, slot)")
		})
	}

	t.Run("another input for a fired slot is refused by the engine", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first, err := schedule.Fire(t.Context(), b.engines[0], b.fee, "client-a", slot0, feeIn{Slot: slot0, Fee: 1})
		require.NoError(t, err)
		require.True(t, first.Created)

		// A firer that read something other than the slot.
		_, err = schedule.Fire(t.Context(), b.engines[1], b.fee, "client-a", slot0, feeIn{Slot: slot0, Fee: 2})
		var reused *engine.ReusedError
		require.ErrorAs(t, err, &reused)
		require.ErrorAs(t, err, new(*engine.ReusedError))
		require.Equal(t, first.ID, reused.Operation)
		require.Equal(t, []string{"fee"}, reused.Fields)

		b.finished(t, b.fee, "client-a", slot0)
		charges := b.charges(t)
		require.Len(t, charges, 1)
		require.Equal(t, int64(1), charges[0].fee)
	})

	t.Run("two operation types share a slot, each once", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for range 3 {
			for i, op := range []*engine.Operation[feeIn, feeState, feeOut]{b.fee, b.interest} {
				_, err := schedule.Fire(t.Context(), b.engines[i], op, "client-a", slot0, feeFor(slot0))
				require.NoError(t, err)
			}
		}
		b.finished(t, b.fee, "client-a", slot0)
		b.finished(t, b.interest, "client-a", slot0)
		perOp := map[string]int{}
		for _, c := range b.charges(t) {
			perOp[c.operation]++
		}
		require.Equal(t, map[string]int{"fee": 1, "interest": 1}, perOp)
	})

	t.Run("a slot whose operation failed is not run again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		scope := closedPrefix + "client-a"
		first, err := schedule.Fire(t.Context(), b.engines[0], b.fee, scope, slot0, feeFor(slot0))
		require.NoError(t, err)
		require.True(t, first.Created)
		info := b.finished(t, b.fee, scope, slot0)
		require.Equal(t, engine.StatusFailed, info.Status)

		again, err := schedule.Fire(t.Context(), b.engines[1], b.fee, scope, slot0, feeFor(slot0))
		require.NoError(t, err, "a firing of a fired slot is no error, whatever its operation's state")
		require.False(t, again.Created)
		require.Equal(t, first.ID, again.ID)
		require.Equal(t, engine.StatusFailed, again.Existing.Status)
		require.EqualValues(t, "account_closed", again.Existing.Error.Code)
		require.Equal(t, 1, b.operations(t))
	})

	t.Run("a time that is not a slot is refused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, slot := range []time.Time{{}, slot0.Add(time.Millisecond), time.Now()} {
			_, err := schedule.Fire(t.Context(), b.engines[0], b.fee, "client-a", slot, feeFor(slot))
			require.ErrorIs(t, err, schedule.ErrNotSlot, "%s", slot)
		}
		require.Zero(t, b.operations(t))
	})

	t.Run("an engine that stopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, b.engines[1].Stop(t.Context()))
		_, err := schedule.Fire(t.Context(), b.engines[1], b.fee, "client-a", slot0, feeFor(slot0))
		require.True(t, errors.Is(err, engine.ErrStopped), "%v", err)
	})
}
