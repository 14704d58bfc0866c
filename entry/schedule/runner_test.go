package schedule_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/schedule"
)

var scopes = []string{"client-a", "client-b", "client-c"}

func TestRunner(t *testing.T) {
	t.Parallel()
	// The runners start 30 seconds into the slot0 slot of a minute's period
	// and run 3 more periods, the clocks moving 10 seconds at a time: each
	// runner fires slot0 at start, then the 3 minutes after it.
	start := slot0.Add(30 * time.Second)
	const (
		step  = 10 * time.Second
		steps = 18
	)
	want := []time.Time{slot0, slot0.Add(time.Minute), slot0.Add(2 * time.Minute), slot0.Add(3 * time.Minute)}

	cases := []struct {
		name string
		// late is how far the second process's clock is behind the first's.
		late   time.Duration
		jitter time.Duration
		// failFirst makes each runner's first call of ScopesFunc fail.
		failFirst bool
		// wantWarning is a message each runner logs.
		wantWarning string
	}{
		{name: "two processes fire each slot at once"},
		{name: "the second process's clock is 20 seconds late", late: 20 * time.Second},
		{name: "with jitter", jitter: 5 * time.Second},
		{name: "a failing scopes function is tried again", failFirst: true, wantWarning: "schedule: firing the slot failed; trying again"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()

			logs := &logRecorder{}
			clocks := [2]*fakeClock{newFakeClock(start), newFakeClock(start.Add(-tc.late))}
			var asked [2]atomic.Int64
			runs := make(chan error, 2)
			for i := range 2 {
				r, err := schedule.New(b.engines[i], b.fee, &schedule.Config[feeIn]{
					Period: time.Minute,
					ScopesFunc: func(_ context.Context, slot time.Time) ([]string, error) {
						if asked[i].Add(1) == 1 && tc.failFirst {
							return nil, errors.New("the clients' table is not reachable")
						}
						return scopes, nil
					},
					InputFunc: func(_ string, slot time.Time) feeIn { return feeFor(slot) },
					Jitter:    tc.jitter,
					Logger:    slog.New(logs),
					Test:      schedule.TestConfig{Clock: clocks[i]},
				})
				require.NoError(t, err)
				go func() { runs <- r.Run(ctx) }()
			}

			for range steps {
				for _, c := range clocks {
					c.BlockUntil(t, 1)
				}
				// Both clocks move before either runner is waited for: at a
				// slot's start, the two fire at once.
				for _, c := range clocks {
					c.Advance(step)
				}
			}
			for _, c := range clocks {
				c.BlockUntil(t, 1)
			}
			cancel()
			for range 2 {
				require.ErrorIs(t, <-runs, context.Canceled)
			}

			for _, scope := range scopes {
				for _, slot := range want {
					info := b.finished(t, b.fee, scope, slot)
					require.Equal(t, engine.StatusSucceeded, info.Status)
				}
			}
			perSlot := map[slotKey]int{}
			for _, c := range b.charges(t) {
				perSlot[slotKey{c.scope, c.slot}]++
			}
			require.Len(t, perSlot, len(scopes)*len(want), "a charge for every scope and slot: %v", perSlot)
			for k, n := range perSlot {
				require.Equal(t, 1, n, "one charge for %v", k)
				require.Contains(t, want, k.slot)
			}
			require.Equal(t, len(scopes)*len(want), b.operations(t))
			for i := range 2 {
				wantAsked := int64(len(want))
				if tc.failFirst {
					wantAsked++
				}
				require.Equal(t, wantAsked, asked[i].Load(), "runner %d asked for the scopes once per slot", i)
			}
			if tc.wantWarning != "" {
				require.Contains(t, logs.messages(), tc.wantWarning)
			} else {
				require.Empty(t, logs.messages())
			}
		})
	}

	t.Run("a process asleep past slots skips them and says so", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		logs := &logRecorder{}
		clock := newFakeClock(start)
		var mu sync.Mutex
		var fired []time.Time
		r, err := schedule.New(b.engines[0], b.fee, &schedule.Config[feeIn]{
			Period: time.Minute,
			ScopesFunc: func(_ context.Context, slot time.Time) ([]string, error) {
				mu.Lock()
				defer mu.Unlock()
				fired = append(fired, slot)
				return scopes[:1], nil
			},
			InputFunc: func(_ string, slot time.Time) feeIn { return feeFor(slot) },
			Logger:    slog.New(logs),
			Test:      schedule.TestConfig{Clock: clock},
		})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		clock.BlockUntil(t, 1)
		clock.Advance(3 * time.Minute) // 10:03:30: 10:01 and 10:02 were slept through
		clock.BlockUntil(t, 1)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)

		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []time.Time{slot0, slot0.Add(3 * time.Minute)}, fired)
		require.Equal(t, []string{"schedule: slots skipped: this process was busy or asleep past their start"}, logs.messages())
	})

	t.Run("FireSlot fires a slot no process fired", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.hourly(t, quiet)
		require.ErrorIs(t, r.FireSlot(t.Context(), slot0.Add(time.Minute)), schedule.ErrNotSlot)
		for range 2 {
			require.NoError(t, r.FireSlot(t.Context(), slot0))
		}
		for _, scope := range scopes {
			b.finished(t, b.fee, scope, slot0)
		}
		require.Len(t, b.charges(t), len(scopes))
	})

	t.Run("FireSlot refuses a slot older than the retention", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.hourly(t, quiet)
		// Its operations may be gone (the engine keeps them 24 hours), so
		// that a firing could run it again.
		old := schedule.Slot(time.Now().Add(-24*time.Hour), time.Hour)
		require.ErrorIs(t, r.FireSlot(t.Context(), old), schedule.ErrSlotExpired)
		require.Empty(t, b.charges(t))
		require.Zero(t, b.operations(t))
		// A slot within the retention, less the margin, fires.
		require.NoError(t, r.FireSlot(t.Context(), old.Add(2*time.Hour)))
		require.Len(t, b.charges(t), len(scopes))
	})

	t.Run("a scope whose slot cannot be fired does not stop the others", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// client-b's slot was started with another input: its firing is
		// refused, for good.
		_, err := schedule.Fire(t.Context(), b.engines[1], b.fee, "client-b", slot0, feeIn{Slot: slot0, Fee: 1})
		require.NoError(t, err)
		logs := &logRecorder{}
		r := b.hourly(t, slog.New(logs))
		err = r.FireSlot(t.Context(), slot0)
		require.ErrorAs(t, err, new(*engine.ReusedError))
		require.Equal(t, []string{"schedule: the slot cannot be fired for the scope; not trying again"}, logs.messages())
		var scopesCharged []string
		for _, scope := range scopes {
			b.finished(t, b.fee, scope, slot0)
		}
		for _, c := range b.charges(t) {
			scopesCharged = append(scopesCharged, c.scope)
		}
		slices.Sort(scopesCharged)
		require.Equal(t, scopes, scopesCharged)
	})
	t.Run("Run ends once the engine stops", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r, err := schedule.New(b.engines[1], b.fee, &schedule.Config[feeIn]{
			Period:     time.Hour,
			ScopesFunc: func(context.Context, time.Time) ([]string, error) { return scopes, nil },
			InputFunc:  func(_ string, slot time.Time) feeIn { return feeFor(slot) },
			Logger:     quiet,
			Test:       schedule.TestConfig{Clock: newFakeClock(start)},
		})
		require.NoError(t, err)
		require.NoError(t, b.engines[1].Stop(t.Context()))
		require.ErrorIs(t, r.Run(t.Context()), engine.ErrStopped)
		require.Zero(t, b.operations(t))
	})
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unregistered := newFee(t, "unregistered")
	scopesFunc := func(context.Context, time.Time) ([]string, error) { return scopes, nil }

	cases := []struct {
		name    string
		op      *engine.Operation[feeIn, feeState, feeOut]
		cfg     *schedule.Config[feeIn]
		wantErr string
	}{
		{"no period", b.fee, &schedule.Config[feeIn]{ScopesFunc: scopesFunc},
			"the period must be a positive whole number of seconds, not 0s"},
		{"a fraction of a second", b.fee, &schedule.Config[feeIn]{Period: 1500 * time.Millisecond, ScopesFunc: scopesFunc},
			"the period must be a positive whole number of seconds, not 1.5s"},
		{"no scopes function", b.fee, &schedule.Config[feeIn]{Period: time.Hour},
			"a scopes function is required"},
		{"a jitter as long as the period", b.fee, &schedule.Config[feeIn]{Period: time.Hour, Jitter: time.Hour, ScopesFunc: scopesFunc},
			"the jitter (1h0m0s) must be at least zero and shorter than the period (1h0m0s)"},
		{"a daily schedule with the engine's default retention", b.fee, &schedule.Config[feeIn]{Period: 24 * time.Hour, ScopesFunc: scopesFunc},
			"a period of 24h0m0s needs the operations kept at least 48h0m0s, and the engine keeps them 24h0m0s"},
		{"a retention shorter than two periods", b.fee, &schedule.Config[feeIn]{Period: 13 * time.Hour, ScopesFunc: scopesFunc},
			"a period of 13h0m0s needs the operations kept at least 26h0m0s, and the engine keeps them 24h0m0s"},
		{"an operation the engine does not run", unregistered, &schedule.Config[feeIn]{Period: time.Hour, ScopesFunc: scopesFunc},
			"operation type not registered"},
		{"no config", b.fee, nil, "a config is required"},
		{"no operation type", nil, &schedule.Config[feeIn]{Period: time.Hour, ScopesFunc: scopesFunc},
			"an operation type is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := schedule.New(b.engines[0], tc.op, tc.cfg)
			require.Nil(t, r)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}

	t.Run("no engine", func(t *testing.T) {
		t.Parallel()
		r, err := schedule.New(nil, b.fee, &schedule.Config[feeIn]{Period: time.Hour, ScopesFunc: scopesFunc})
		require.Nil(t, r)
		require.ErrorContains(t, err, "an engine is required")
	})

	t.Run("a daily schedule whose operations are kept 48 hours", func(t *testing.T) {
		t.Parallel()
		daily := newFeeKept(t, "daily", 48*time.Hour)
		e := idemflowtest.Engine(t, b.pool, &engine.Config{Logger: quiet}, daily)
		_, err := schedule.New(e, daily, &schedule.Config[feeIn]{Period: 24 * time.Hour, ScopesFunc: scopesFunc})
		require.NoError(t, err)
	})
}
