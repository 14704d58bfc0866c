package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/testdb"
)

// The wait tests run an operation that holds an amount (a row of
// wait_hold, removed by its compensation), waits, and books it (a row of
// wait_book).

type waitIn struct {
	Amount int64 `json:"amount"`
}

type waitState struct {
	Held   bool   `json:"held"`
	Signal string `json:"signal,omitempty"`
	Timed  bool   `json:"timed,omitempty"`
}

const waitSchema = `
CREATE TABLE wait_hold (operation_id uuid PRIMARY KEY, amount bigint NOT NULL);
CREATE TABLE wait_book (operation_id uuid PRIMARY KEY, amount bigint NOT NULL);
`

func waitHold(ctx context.Context, tx engine.Tx, at engine.Attempt, in waitIn, s *waitState) error {
	s.Held = true
	_, err := tx.Exec(ctx, `INSERT INTO wait_hold VALUES ($1, $2)`, at.OperationID, in.Amount)
	return err
}

func waitRelease(ctx context.Context, tx engine.Tx, at engine.Attempt, _ waitIn, _ *waitState) error {
	_, err := tx.Exec(ctx, `DELETE FROM wait_hold WHERE operation_id = $1`, at.OperationID)
	return err
}

func waitBook(ctx context.Context, tx engine.Tx, at engine.Attempt, in waitIn, _ *waitState) error {
	_, err := tx.Exec(ctx, `INSERT INTO wait_book VALUES ($1, $2)`, at.OperationID, in.Amount)
	return err
}

// waitOp is hold, the steps given, book.
func waitOp(t *testing.T, name string, steps ...engine.Step[waitIn, waitState]) *engine.Operation[waitIn, waitState, waitState] {
	t.Helper()
	all := []engine.Step[waitIn, waitState]{engine.TxStep("hold", waitHold).Compensate(waitRelease)}
	all = append(all, steps...)
	all = append(all, engine.TxStep("book", waitBook))
	op, err := engine.NewOperation(name, all, func(_ waitIn, s *waitState) (waitState, error) { return *s, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 10 * time.Millisecond, Cap: 50 * time.Millisecond}})
	require.NoError(t, err)
	return op
}

func waitSetup(t *testing.T, ops ...engine.Definition) (*engine.Engine, *pgxpool.Pool) {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), waitSchema)
	require.NoError(t, err)
	return idemflowtest.Engine(t, pool, nil, ops...), pool
}

// waitCounts reads how many holds and bookings there are.
func waitCounts(t *testing.T, pool *pgxpool.Pool) (holds, books int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM wait_hold), (SELECT count(*) FROM wait_book)`).Scan(&holds, &books))
	return holds, books
}

// startWait starts op and returns its id once the operation waits at step.
func startWait(t *testing.T, e *engine.Engine, op *engine.Operation[waitIn, waitState, waitState], key, step string) uuid.UUID {
	t.Helper()
	s, err := engine.Start(context.Background(), e, op, "client", key, waitIn{Amount: 100}, nil)
	require.NoError(t, err)
	awaitStep(t, e, s.ID, step, engine.StepStatusWaiting)
	return s.ID
}

func awaitStep(t *testing.T, e *engine.Engine, id uuid.UUID, step string, status engine.StepStatus) *engine.Info {
	t.Helper()
	var info *engine.Info
	require.Eventually(t, func() bool {
		var err error
		info, err = e.Get(context.Background(), id)
		require.NoError(t, err)
		for _, s := range info.Steps {
			if s.Name == step {
				return s.Status == status
			}
		}
		return false
	}, 20*time.Second, 10*time.Millisecond, "step %s never became %s", step, status)
	return info
}

func finished(t *testing.T, e *engine.Engine, id uuid.UUID) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	info, err := e.Wait(ctx, id)
	require.NoError(t, err)
	return info
}

func stepOf(info *engine.Info, name string) engine.StepInfo {
	for _, s := range info.Steps {
		if s.Name == name {
			return s
		}
	}
	return engine.StepInfo{}
}

func TestSignalStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "signalled", engine.SignalStep("confirm", "confirmed",
		func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
			var body struct{ By string }
			if err := json.Unmarshal(sig.Payload, &body); err != nil {
				return engine.Fail("bad_signal", err.Error())
			}
			s.Signal = body.By
			return nil
		}))
	e, pool := waitSetup(t, op)
	id := startWait(t, e, op, "k1", "confirm")

	info, err := e.Get(ctx, id)
	require.NoError(t, err)
	w := stepOf(info, "confirm").Wait
	require.NotNil(t, w)
	require.Equal(t, engine.WaitSignal, w.Reason)
	require.Equal(t, "confirmed", w.Signal)
	require.Nil(t, w.Until)
	require.False(t, info.NeedsAttention())
	var jobs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE state IN ('available', 'scheduled', 'running', 'retryable')`).Scan(&jobs))
	require.Zero(t, jobs, "a waiting operation holds no River job")

	// Unknown operations, another client's, reserved names: refused.
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: uuid.New()}, engine.Signal{ID: "s", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id, Scope: "other"}, engine.Signal{ID: "s", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "s", Name: "idemflow.approve"})
	require.Error(t, err)

	// By the client's key, in the caller's transaction.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	added, err := e.Signal(ctx, tx, engine.SignalTo{Scope: "client", Key: "k1"},
		engine.Signal{ID: "sig-1", Name: "confirmed", Payload: json.RawMessage(`{"By": "ann"}`)})
	require.NoError(t, err)
	require.True(t, added)
	require.NoError(t, tx.Commit(ctx))

	done := finished(t, e, id)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.JSONEq(t, `{"held": true, "signal": "ann"}`, string(done.Result))

	// The same signal again: kept once; another payload under its id: refused, naming it.
	added, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id},
		engine.Signal{ID: "sig-1", Name: "confirmed", Payload: json.RawMessage(`{"By":"ann"}`)})
	require.NoError(t, err)
	require.False(t, added)
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id},
		engine.Signal{ID: "sig-1", Name: "confirmed", Payload: json.RawMessage(`{"By": "bob"}`)})
	var reused *engine.ReusedError
	require.ErrorAs(t, err, &reused)
	require.Equal(t, []string{"payload"}, reused.Fields)
	// A new signal to a finished operation.
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "sig-2", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrFinished)
	holds, books := waitCounts(t, pool)
	require.Equal(t, [2]int{1, 1}, [2]int{holds, books})
}

// A signal sent before its step is reached waits for it, and is applied
// when the step gets there.
func TestSignalBeforeStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "early",
		engine.TimerStep("pause", func(waitIn, *waitState) engine.Deadline { return engine.Deadline{After: 500 * time.Millisecond} }),
		engine.SignalStep("confirm", "confirmed",
			func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
				s.Signal = sig.ID
				return nil
			}))
	e, _ := waitSetup(t, op)
	id := startWait(t, e, op, "k1", "pause")
	added, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "early-1", Name: "confirmed"})
	require.NoError(t, err)
	require.True(t, added)
	info := finished(t, e, id)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.JSONEq(t, `{"held": true, "signal": "early-1"}`, string(info.Result))
}

// A deadline that passes with no signal fails the step (and compensates),
// or runs the timeout function; a signal after it is refused.
func TestSignalDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	apply := func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
		s.Signal = sig.ID
		return nil
	}
	after := func(d time.Duration) func(waitIn, *waitState) engine.Deadline {
		return func(waitIn, *waitState) engine.Deadline { return engine.Deadline{After: d} }
	}
	failing := waitOp(t, "deadline-fails", engine.SignalStep("confirm", "confirmed", apply).Deadline(after(300*time.Millisecond), nil))
	timing := waitOp(t, "deadline-times", engine.SignalStep("confirm", "confirmed", apply).Deadline(after(300*time.Millisecond),
		func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState) error {
			s.Timed = true
			return nil
		}))
	past := waitOp(t, "deadline-past", engine.SignalStep("confirm", "confirmed", apply).Deadline(
		func(waitIn, *waitState) engine.Deadline { return engine.Deadline{At: time.Now().Add(-time.Hour)} }, nil))
	e, pool := waitSetup(t, failing, timing, past)

	id := startWait(t, e, failing, "f", "confirm")
	info, err := e.Get(ctx, id)
	require.NoError(t, err)
	require.NotNil(t, stepOf(info, "confirm").Wait.Until)
	info = finished(t, e, id)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeSignalTimeout, info.Error.Code)
	require.False(t, info.Error.ServerFault())
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "late", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrFinished)

	id = startWait(t, e, timing, "t", "confirm")
	info = finished(t, e, id)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.JSONEq(t, `{"held": true, "timed": true}`, string(info.Result))

	// A deadline in the past fires at once.
	s, err := engine.Start(ctx, e, past, "client", "p", waitIn{Amount: 1}, nil)
	require.NoError(t, err)
	info = finished(t, e, s.ID)
	require.EqualValues(t, engine.CodeSignalTimeout, info.Error.Code)

	holds, books := waitCounts(t, pool)
	require.Equal(t, [2]int{1, 1}, [2]int{holds, books}, "the failed ones released their hold; only the timed one booked")
}

// The signal and the deadline race: whichever commits first wins, and the
// other is refused.
func TestSignalRacesDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "race", engine.SignalStep("confirm", "confirmed",
		func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
			s.Signal = sig.ID
			return nil
		}).Deadline(func(waitIn, *waitState) engine.Deadline { return engine.Deadline{After: 200 * time.Millisecond} }, nil))
	e, pool := waitSetup(t, op)
	for i := range 8 {
		id := startWait(t, e, op, "k"+string(rune('a'+i)), "confirm")
		time.Sleep(time.Duration(150+10*i) * time.Millisecond)
		_, serr := e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "s", Name: "confirmed"})
		info := finished(t, e, id)
		if serr == nil {
			require.Equal(t, engine.StatusSucceeded, info.Status, "a signal accepted is applied")
		} else {
			require.True(t, errors.Is(serr, engine.ErrWaitOver) || errors.Is(serr, engine.ErrFinished), "%v", serr)
			require.Equal(t, engine.StatusFailed, info.Status)
		}
	}
	holds, books := waitCounts(t, pool)
	require.Equal(t, holds, books, "every operation either booked its hold or released it")
}

func TestTimerStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var at time.Time // set before the start; read when the step is reached
	op := waitOp(t, "timed",
		engine.TimerStep("release", func(waitIn, *waitState) engine.Deadline { return engine.Deadline{At: at} }))
	e, pool := waitSetup(t, op)
	at = time.Now().Add(time.Second)
	id := startWait(t, e, op, "k1", "release")
	info, err := e.Get(ctx, id)
	require.NoError(t, err)
	w := stepOf(info, "release").Wait
	require.Equal(t, engine.WaitTimer, w.Reason)
	require.WithinDuration(t, at, *w.Until, time.Millisecond)
	info = finished(t, e, id)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	require.False(t, info.FinishedAt.Before(at.Add(-50*time.Millisecond)), "passed before its moment")
	_, books := waitCounts(t, pool)
	require.Equal(t, 1, books)
}

func TestApprovalStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	policy := func(in waitIn, _ *waitState) engine.ApprovalPolicy {
		if in.Amount < 50 {
			return engine.ApprovalPolicy{}
		}
		return engine.ApprovalPolicy{Need: 2, Expires: engine.Deadline{After: time.Hour}}
	}
	op := waitOp(t, "approved", engine.ApprovalStep("approval", policy).Codes("refund_rejected", ""))
	e, pool := waitSetup(t, op)
	as := func(actor string) context.Context { return engine.WithActor(ctx, actor) }

	// Below the threshold: passes at once.
	s, err := engine.Start(ctx, e, op, "client", "small", waitIn{Amount: 10}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, finished(t, e, s.ID).Status)
	_, err = e.Approve(as("ann"), s.ID, "late")
	require.ErrorIs(t, err, engine.ErrFinished)

	id := startWait(t, e, op, "big", "approval")
	list, err := e.Approvals(ctx, 0)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, id, list[0].OperationID)
	require.Equal(t, 2, list[0].Need)
	require.NotNil(t, list[0].ExpiresAt)

	_, err = e.Approve(as("ann"), id, "")
	require.ErrorIs(t, err, engine.ErrReasonRequired)
	info, err := e.Approve(as("ann"), id, "looks right")
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.Equal(t, []string{"ann"}, stepOf(info, "approval").Wait.ApprovedBy)
	info, err = e.Approve(as("ann"), id, "again")
	require.NoError(t, err, "an actor who approved before changes nothing")
	require.Equal(t, []string{"ann"}, stepOf(info, "approval").Wait.ApprovedBy)
	time.Sleep(200 * time.Millisecond)
	info, err = e.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, info.Status, "one distinct actor is not two")
	require.False(t, info.NeedsAttention())

	_, err = e.Approve(as("bob"), id, "four eyes")
	require.NoError(t, err)
	info = finished(t, e, id)
	require.Equal(t, engine.StatusSucceeded, info.Status)
	_, err = e.Reject(as("cat"), id, "too late")
	require.ErrorIs(t, err, engine.ErrFinished)

	// A rejection compensates.
	id = startWait(t, e, op, "rejected", "approval")
	_, err = e.Reject(as("dan"), id, "not this one")
	require.NoError(t, err)
	info = finished(t, e, id)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, "refund_rejected", info.Error.Code)
	require.False(t, info.Error.ServerFault())

	full, err := e.Get(ctx, id)
	require.NoError(t, err)
	require.Len(t, full.Audit, 1)
	require.Equal(t, engine.ActionReject, full.Audit[0].Action)
	require.Equal(t, "dan", full.Audit[0].Actor)
	require.Equal(t, "done", full.Audit[0].Result)

	holds, books := waitCounts(t, pool)
	require.Equal(t, [2]int{2, 2}, [2]int{holds, books})

	// Not waiting for approval yet: refused, audited.
	_, err = e.Approve(as("ann"), uuid.New(), "who")
	require.ErrorIs(t, err, engine.ErrNotFound)
}

func TestApprovalExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "expiring", engine.ApprovalStep("approval", func(waitIn, *waitState) engine.ApprovalPolicy {
		return engine.ApprovalPolicy{Need: 1, Expires: engine.Deadline{After: 300 * time.Millisecond}}
	}))
	e, pool := waitSetup(t, op)
	id := startWait(t, e, op, "k", "approval")
	info := finished(t, e, id)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeApprovalExpired, info.Error.Code)
	_, err := e.Approve(engine.WithActor(ctx, "ann"), id, "too late")
	require.ErrorIs(t, err, engine.ErrFinished)
	full, err := e.Get(ctx, id)
	require.NoError(t, err)
	require.Len(t, full.Audit, 1)
	require.Equal(t, "refused", full.Audit[0].Result)
	holds, books := waitCounts(t, pool)
	require.Equal(t, [2]int{0, 0}, [2]int{holds, books})
}

// A waiting operation is cancelled as any other before its point of no
// return: what it holds is released.
func TestWaitCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "cancelled", engine.SignalStep("confirm", "confirmed",
		func(context.Context, engine.Tx, engine.Attempt, waitIn, *waitState, engine.Signal) error { return nil }))
	e, pool := waitSetup(t, op)
	id := startWait(t, e, op, "k", "confirm")
	info, err := e.Cancel(ctx, id, "customer gave up")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.EqualValues(t, engine.CodeCancelled, info.Error.Code)
	holds, books := waitCounts(t, pool)
	require.Equal(t, [2]int{0, 0}, [2]int{holds, books})
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "s", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrFinished)
}

// A signal sent in a transaction that rolls back was never sent.
func TestSignalRolledBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "rolled", engine.SignalStep("confirm", "confirmed",
		func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
			s.Signal = sig.ID
			return nil
		}))
	e, pool := waitSetup(t, op)
	id := startWait(t, e, op, "k", "confirm")
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = e.Signal(ctx, tx, engine.SignalTo{OperationID: id}, engine.Signal{ID: "first", Name: "confirmed"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	time.Sleep(300 * time.Millisecond)
	info, err := e.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusInProgress, info.Status)
	added, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "second", Name: "confirmed"})
	require.NoError(t, err)
	require.True(t, added)
	require.JSONEq(t, `{"held": true, "signal": "second"}`, string(finished(t, e, id).Result))
}

// An operator's handle with no definitions approves at once; a live
// process carries the operation on.
func TestAdminApprove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	op := waitOp(t, "admin-approved", engine.ApprovalStep("approval", func(waitIn, *waitState) engine.ApprovalPolicy {
		return engine.ApprovalPolicy{Need: 1}
	}))
	e, pool := waitSetup(t, op)
	id := startWait(t, e, op, "k", "approval")
	admin, err := engine.NewAdmin(ctx, pool)
	require.NoError(t, err)
	list, err := admin.Approvals(ctx, 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Nil(t, list[0].ExpiresAt, "no expiry")
	_, err = admin.Reject(engine.WithActor(ctx, "ann"), id, "")
	require.ErrorIs(t, err, engine.ErrReasonRequired)
	info, err := admin.Approve(engine.WithActor(ctx, "ann"), id, "fine")
	require.NoError(t, err)
	require.Equal(t, []string{"ann"}, stepOf(info, "approval").Wait.ApprovedBy)
	require.Equal(t, engine.StatusSucceeded, finished(t, e, id).Status)
	full, err := e.Get(ctx, id)
	require.NoError(t, err)
	require.Len(t, full.Audit, 2)
	require.Equal(t, "refused", full.Audit[0].Result)
	require.Equal(t, engine.ActionApprove, full.Audit[1].Action)
	require.Equal(t, "done", full.Audit[1].Result)
}

// A timer whose moment passes while no process runs fires in the first to
// start after it, once.
func TestTimerAcrossRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := pool.Exec(ctx, waitSchema)
	require.NoError(t, err)
	op := waitOp(t, "restarted",
		engine.TimerStep("release", func(waitIn, *waitState) engine.Deadline { return engine.Deadline{After: 300 * time.Millisecond} }))
	first := idemflowtest.NewEngine(t, pool, nil, op)
	s, err := engine.Start(ctx, first, op, "client", "k", waitIn{Amount: 7}, nil)
	require.NoError(t, err)
	awaitStep(t, first, s.ID, "release", engine.StepStatusWaiting)
	require.NoError(t, first.Stop(ctx))
	time.Sleep(500 * time.Millisecond) // past the moment, with no process up

	second := idemflowtest.Engine(t, pool, nil, op)
	third := idemflowtest.Engine(t, pool, nil, op)
	require.Equal(t, engine.StatusSucceeded, finished(t, second, s.ID).Status)
	_ = third
	_, books := waitCounts(t, pool)
	require.Equal(t, 1, books)
}

// A signal to a step that another signal decided is refused: it would never
// be applied. Two steps cannot wait for one signal.
func TestSignalAfterDecided(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	apply := func(_ context.Context, _ engine.Tx, _ engine.Attempt, _ waitIn, s *waitState, sig engine.Signal) error {
		s.Signal = sig.ID
		return nil
	}
	op := waitOp(t, "decided", engine.SignalStep("confirm", "confirmed", apply),
		engine.SignalStep("settle", "settled", apply))
	e, _ := waitSetup(t, op)
	id := startWait(t, e, op, "k", "confirm")
	_, err := e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "one", Name: "confirmed"})
	require.NoError(t, err)
	awaitStep(t, e, id, "settle", engine.StepStatusWaiting)
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "two", Name: "confirmed"})
	require.ErrorIs(t, err, engine.ErrWaitOver)
	_, err = e.Signal(ctx, nil, engine.SignalTo{OperationID: id}, engine.Signal{ID: "three", Name: "settled"})
	require.NoError(t, err)
	require.JSONEq(t, `{"held": true, "signal": "three"}`, string(finished(t, e, id).Result))

	_, err = engine.NewOperation("twice", []engine.Step[waitIn, waitState]{
		engine.SignalStep("a", "same", apply), engine.SignalStep("b", "same", apply),
	}, func(_ waitIn, s *waitState) (waitState, error) { return *s, nil }, nil)
	require.ErrorContains(t, err, "wait for the same signal")
}
