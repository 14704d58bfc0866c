package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
)

func TestPermanentFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeclineCompensatesLedger", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		b.declinePayout.Store(true)
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: 3}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "declined", info.Error.Code)
		require.Equal(t, int32(1), b.calls.Load(), "a permanent error is not retried")
		require.Equal(t, books{ledgerRows: 2, reversals: 2}, readBooks(t, b.pool))

		again, err := e.GetByKey(ctx, "c", "k")
		require.NoError(t, err)
		require.EqualValues(t, "declined", again.Error.Code)
		require.Equal(t, "payout", again.Error.Step)
	})

	t.Run("FirstStepFailureStoresTheAnswer", func(t *testing.T) {
		t.Parallel()
		e, op, b := setup(t, setupOpts{})
		started, err := engine.Start(ctx, e, op, "c", "k", transferIn{From: "a", To: "b", Amount: -1}, nil)
		require.NoError(t, err)
		require.True(t, started.Created)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.EqualValues(t, "invalid_amount", info.Error.Code)
		require.Equal(t, books{}, readBooks(t, b.pool))
	})

	t.Run("CompensationsRunInReverseOrder", func(t *testing.T) {
		t.Parallel()
		pool := setupPool(t)
		var mu sync.Mutex
		var order []string
		step := func(name string, fail bool) engine.Step[int, int] {
			return engine.TxStep(name, func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
				if fail {
					return engine.Fail("nope", "step "+name+" refuses")
				}
				return nil
			}).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, in int, s *int) error {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, name)
				return nil
			})
		}
		op, err := engine.NewOperation("chain", []engine.Step[int, int]{
			step("a", false), step("b", false), step("c", false), step("d", true), step("e", false),
		}, func(in int, s *int) (int, error) { return 0, nil }, nil)
		require.NoError(t, err)
		e := idemflowtest.Engine(t, pool, nil, op)
		started, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, []string{"c", "b", "a"}, order)
		got, err := e.Get(ctx, started.ID)
		require.NoError(t, err)
		var statuses []engine.StepStatus
		for _, s := range got.Steps {
			statuses = append(statuses, s.Status)
		}
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, statuses)
	})
}

// TestPivotForwardOnly: a step after the pivot that keeps failing transiently
// is retried past its MaxAttempts at the policy's cap, needing attention and
// never compensated, and finishes once the fault clears.
func TestPivotForwardOnly(t *testing.T) {
	t.Parallel()
	const failures = 3 // book fails 3 times; MaxAttempts is 2
	for _, tc := range []struct {
		name   string
		inline time.Duration
		runs   int
	}{
		// Every backoff is waited out by the first run.
		{"Inline", time.Second, 1},
		// Every retry is a River job: one run per attempt.
		{"River", -1, failures + 1},
		// The backoff within MaxAttempts (5ms) is waited out in the run; past
		// them the delay is the cap (20ms), longer than InlineRetryMax, so
		// each retry is a River job: attempts 1 and 2 in the first run, 3 and
		// 4 in a run each. A retry past the pivot at the backoff rather than
		// the cap would stay in the first run.
		{"CapThroughRiver", 10 * time.Millisecond, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			f := &fsFlow{
				pool:   pool,
				lookup: true,
				retry:  engine.RetryPolicy{Base: 5 * time.Millisecond, Factor: 1, Cap: 20 * time.Millisecond, MaxAttempts: 2},
				bookFault: func(n int) error {
					if n <= failures {
						return errors.New("ledger busy")
					}
					return nil
				},
			}
			op := f.op(t, "pivot")
			gate := newFSGate(fsAt("book", faults.PointBefore, failures+1))
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease, InlineRetryMax: tc.inline, Faults: engine.Faults{Hook: gate.hook}}, op)
			fsHurry(t, pool)

			s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
			require.NoError(t, err)
			gate.wait(t) // attempt 4 of book, past MaxAttempts

			info := fsGet(t, e, s.ID)
			require.Equal(t, engine.StatusInProgress, info.Status)
			require.True(t, info.NeedsAttention())
			require.EqualValues(t, engine.CodeRetryingPastPivot, info.Attention.Code)
			require.False(t, info.Parked)
			require.Nil(t, info.Error)
			require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusRunning}, fsStatuses(info))
			require.Equal(t, failures, info.Steps[2].Attempts)
			require.NotEmpty(t, info.Steps[2].LastError)
			require.Zero(t, f.debitUndos.Load(), "compensated past the pivot")
			require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))
			_, err = e.Cancel(ctx, s.ID, "give up")
			require.ErrorIs(t, err, engine.ErrPastPivot, "Cancel refuses past the pivot, whoever holds the operation")

			gate.open()
			done := fsWait(t, e, s.ID)
			require.Equal(t, engine.StatusSucceeded, done.Status)
			got := fsGet(t, e, s.ID)
			require.Nil(t, got.Attention)
			require.False(t, got.NeedsAttention())
			require.Equal(t, tc.runs, got.Runs)
			require.Equal(t, failures+1, got.Steps[2].Attempts)
			require.Zero(t, f.debitUndos.Load(), "compensated past the pivot")
			require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
		})
	}
}

// TestFailedPastPivotParks: a permanent failure after the pivot parks the
// operation, needing attention, with nothing compensated and nothing retried,
// Cancel refuses it, and an operator's Retry finishes it.
func TestFailedPastPivotParks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	var closed atomic.Bool
	closed.Store(true)
	f := &fsFlow{
		pool:   pool,
		lookup: true,
		retry:  engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3},
		bookFault: func(int) error {
			if closed.Load() {
				return engine.Fail("ledger_closed", "the ledger is closed")
			}
			return nil
		},
	}
	op := f.op(t, "parked")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
	fsHurry(t, pool)

	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	info := fsAwait(t, e, s.ID, "parked", fsParked)
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.True(t, info.NeedsAttention())
	require.EqualValues(t, engine.CodeFailedPastPivot, info.Attention.Code)
	require.Contains(t, info.Attention.Reason, "ledger_closed")
	require.Nil(t, info.Error)
	require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusRunning}, fsStatuses(info))
	require.Equal(t, 1, info.Steps[2].Attempts)
	require.Equal(t, int32(1), f.bookCalls.Load())
	require.Zero(t, f.debitUndos.Load(), "compensated past the pivot")
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

	fsNoMoreRuns(t, e, pool, s.ID)
	require.Equal(t, int32(1), f.bookCalls.Load(), "a parked operation was retried")

	_, err = e.Cancel(ctx, s.ID, "give up")
	require.ErrorIs(t, err, engine.ErrPastPivot)
	again := fsGet(t, e, s.ID)
	require.True(t, again.Parked, "a refused cancel unparked the operation")
	require.EqualValues(t, engine.CodeFailedPastPivot, again.Attention.Code)
	require.Equal(t, engine.StatusInProgress, again.Status)
	require.Zero(t, f.debitUndos.Load())

	closed.Store(false)
	require.NoError(t, errOf(e.Retry(ctx, s.ID, nil)), nil)
	done := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	got := fsGet(t, e, s.ID)
	require.Nil(t, got.Attention)
	require.False(t, got.Parked)
	require.Equal(t, int32(2), f.bookCalls.Load())
	require.Zero(t, f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
}

type fsCountIn struct {
	N int `json:"n"`
}

type fsSeenState struct {
	Seen int `json:"seen"`
}

// TestUndecodableStateParks: an operation whose stored state (or input) no
// longer decodes into this process's types is parked by the first run that
// reads it, and stays parked: its runs stop growing. Cancel ends it without
// decoding when nothing is to be compensated, and refuses, changing nothing,
// when something is.
func TestUndecodableStateParks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		corrupt    string
		compensate bool
	}{
		{"State", `UPDATE idemflow_operation SET checkpoints = jsonb_set(checkpoints, '{first,o}', to_jsonb('{"renamed": 1}'::text)) WHERE id = $1`, false},
		{"Input", `UPDATE idemflow_operation SET input = '{"renamed": 1}' WHERE id = $1`, false},
		{"StateWithCompensation", `UPDATE idemflow_operation SET checkpoints = jsonb_set(checkpoints, '{first,o}', to_jsonb('{"renamed": 1}'::text)) WHERE id = $1`, true},
		{"InputWithCompensation", `UPDATE idemflow_operation SET input = '{"renamed": 1}' WHERE id = $1`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			var undos, secondCalls atomic.Int32
			first := engine.TxStep("first", func(_ context.Context, _ engine.Tx, _ engine.Attempt, in fsCountIn, s *fsSeenState) error {
				s.Seen = in.N
				return nil
			})
			if tc.compensate {
				first = first.Compensate(func(context.Context, engine.Tx, engine.Attempt, fsCountIn, *fsSeenState) error {
					undos.Add(1)
					return nil
				})
			}
			op, err := engine.NewOperation("undecodable", []engine.Step[fsCountIn, fsSeenState]{
				first,
				// Fails, to be retried an hour later by a River job.
				engine.TxStep("second", func(context.Context, engine.Tx, engine.Attempt, fsCountIn, *fsSeenState) error {
					secondCalls.Add(1)
					return errors.New("not yet")
				}).Retries(engine.RetryPolicy{Base: time.Hour, Cap: time.Hour}),
			}, func(in fsCountIn, s *fsSeenState) (int, error) { return s.Seen, nil }, nil)
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: defaultLease}, op)
			s, err := engine.Start(ctx, e, op, "c", "k", fsCountIn{N: 7}, nil)
			require.NoError(t, err)
			fsAwait(t, e, s.ID, "second's failure recorded", func(i *engine.Info) bool { return i.Steps[1].Attempts == 1 })

			// A deploy renamed a field: what is stored no longer decodes. A resume
			// is due now.
			_, err = pool.Exec(ctx, tc.corrupt, s.ID)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
			require.NoError(t, err)
			require.NoError(t, e.Sweep(ctx))
			info := fsAwait(t, e, s.ID, "parked", fsParked)
			require.Equal(t, engine.StatusInProgress, info.Status)
			require.True(t, info.NeedsAttention())
			require.EqualValues(t, engine.CodeUndecodableState, info.Attention.Code)
			require.Contains(t, info.Attention.Reason, "renamed")
			require.Equal(t, 2, info.Runs, "parked by the first run that read it")
			require.Equal(t, int32(1), secondCalls.Load(), "nothing ran on a state that does not decode")

			fsNoMoreRuns(t, e, pool, s.ID)
			require.Equal(t, 2, fsGet(t, e, s.ID).Runs, "runs kept growing")
			require.Equal(t, int32(1), secondCalls.Load())

			cancelled, err := e.Cancel(ctx, s.ID, "stale deploy")
			if tc.compensate {
				// The compensation would need what does not decode.
				require.ErrorContains(t, err, "does not decode")
				require.NotErrorIs(t, err, engine.ErrRunning)
				again := fsGet(t, e, s.ID)
				require.Equal(t, engine.StatusInProgress, again.Status)
				require.True(t, again.Parked, "a refused cancel unparked the operation")
				require.EqualValues(t, engine.CodeUndecodableState, again.Attention.Code)
				require.Zero(t, undos.Load())
				return
			}
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, cancelled.Status)
			require.EqualValues(t, engine.CodeCancelled, cancelled.Error.Code)
			require.Equal(t, "stale deploy", cancelled.Error.Cause)
			got := fsGet(t, e, s.ID)
			require.Equal(t, engine.StatusFailed, got.Status)
			require.EqualValues(t, engine.CodeCancelled, got.Error.Code)
			require.Nil(t, got.Attention)
			require.False(t, got.Parked)
			require.Equal(t, int32(1), secondCalls.Load())
		})
	}
}
