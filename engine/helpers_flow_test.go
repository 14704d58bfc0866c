package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
)

// The tests of this file prove the failure semantics of the engine, one rule
// each: forward only past the pivot, parked operations, Cancel refused past the
// pivot, external steps out of attempts, contained panics, undecodable state,
// NewOperation's type checks, fences by run, key reuse, client-facing texts,
// Halt, and fresh derived keys after retention; and one more, that a failing
// compensation is not retried forever, which the engine breaks today
// (TestCompensationRetriesBoundedAcrossRuns).
//
// Most use fsFlow: debit (a transactional step with a compensation), pay (an
// external step without one, so the pivot) and book (a transactional step),
// over scratch tables, with faults injected per attempt. Their engines have
// the engine's default lease (Lease: engine.DefaultLease, 15 seconds) where
// idemflowtest's is a second: a run held at a gate is taken over only when the
// test expires its lease itself.

const fsSchema = `
CREATE TABLE fs_ledger (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL, reversal boolean NOT NULL DEFAULT false);
CREATE TABLE fs_payment (key text PRIMARY KEY, id text NOT NULL, requests int NOT NULL DEFAULT 1);
CREATE TABLE fs_booking (debit_id bigint PRIMARY KEY, payment_id text NOT NULL);
`

type fsIn struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

type fsState struct {
	DebitID   int64  `json:"debitId"`
	PaymentID string `json:"paymentId"`
}

// fsFlow builds the debit, pay, book operation and counts what its steps do.
// Set its fields before op; the fault functions are called from the runs.
type fsFlow struct {
	pool  *pgxpool.Pool
	retry engine.RetryPolicy
	// bookRetry is the book step's own retry policy.
	bookRetry engine.RetryPolicy
	// lookup gives pay a lookup; undoablePay gives it a compensation, which
	// makes it no pivot.
	lookup      bool
	undoablePay bool
	// settle is pay's settle window: none unless a test sets one.
	settle time.Duration

	// payFault decides pay's attempt: whether the provider records the
	// payment, and what the step returns (with record, a lost answer). Nil:
	// recorded, nil.
	payFault func(attempt int) (record bool, err error)
	// lookupFault, when it returns an error (or panics), is the lookup's answer.
	lookupFault func(attempt int) error
	// bookFault is called with the number of book's calls so far, this one
	// included; an error it returns (or a panic) fails the attempt.
	bookFault func(call int) error
	// undoFault is called after debit's compensation wrote its reversal, with
	// the number of compensation calls so far.
	undoFault   func(call int) error
	resultFault func() error

	debitUndos, payUndos, payCalls, lookups, bookCalls atomic.Int32

	mu sync.Mutex
	// events are "call:<attempt>" and "lookup:<attempt>:found|missing", in order.
	events []string
	// keys are the derived keys pay was called with, in order.
	keys []string
}

func (f *fsFlow) record(event string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, event)
}

func (f *fsFlow) recorded() (events, keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...), append([]string(nil), f.keys...)
}

func (f *fsFlow) op(t *testing.T, name string) *engine.Operation[fsIn, fsState, fsState] {
	t.Helper()
	// The tests of these mechanics take a provider whose answers are final
	// when the call returns (no settle window) unless they set one.
	pay := engine.ExternalStep("pay", f.pay).Settle(f.settle)
	if f.lookup {
		pay = pay.Lookup(f.lookupPay)
	}
	if f.undoablePay {
		pay = pay.Compensate(func(context.Context, engine.Tx, engine.Attempt, fsIn, *fsState) error {
			f.payUndos.Add(1)
			return nil
		})
	}
	op, err := engine.NewOperation(name, []engine.Step[fsIn, fsState]{
		engine.TxStep("debit", f.debit).Compensate(f.undoDebit),
		pay,
		engine.TxStep("book", f.book).Retries(f.bookRetry),
	}, f.result, &engine.OperationOpts{Retry: f.retry})
	require.NoError(t, err)
	return op
}

func (f *fsFlow) debit(ctx context.Context, tx engine.Tx, _ engine.Attempt, in fsIn, s *fsState) error {
	return tx.QueryRow(ctx, `INSERT INTO fs_ledger (account, amount) VALUES ($1, $2) RETURNING id`, in.Account, -in.Amount).Scan(&s.DebitID)
}

func (f *fsFlow) undoDebit(ctx context.Context, tx engine.Tx, _ engine.Attempt, in fsIn, s *fsState) error {
	n := int(f.debitUndos.Add(1))
	if _, err := tx.Exec(ctx, `INSERT INTO fs_ledger (account, amount, reversal) VALUES ($1, $2, true)`, in.Account, in.Amount); err != nil {
		return err
	}
	if f.undoFault != nil {
		return f.undoFault(n)
	}
	return nil
}

func (f *fsFlow) pay(ctx context.Context, call engine.Attempt, in fsIn, s *fsState) error {
	f.payCalls.Add(1)
	f.mu.Lock()
	f.events = append(f.events, fmt.Sprintf("call:%d", call.Number))
	f.keys = append(f.keys, call.Key)
	f.mu.Unlock()
	record, err := true, error(nil)
	if f.payFault != nil {
		record, err = f.payFault(call.Number)
	}
	if record {
		if qerr := f.pool.QueryRow(ctx, `INSERT INTO fs_payment (key, id) VALUES ($1, 'pay_' || md5($1))
			ON CONFLICT (key) DO UPDATE SET requests = fs_payment.requests + 1 RETURNING id`, call.Key).Scan(&s.PaymentID); qerr != nil {
			return qerr
		}
	}
	return err
}

func (f *fsFlow) lookupPay(ctx context.Context, call engine.Attempt, in fsIn, s *fsState) (bool, error) {
	f.lookups.Add(1)
	if f.lookupFault != nil {
		if err := f.lookupFault(call.Number); err != nil {
			return false, err
		}
	}
	err := f.pool.QueryRow(ctx, `SELECT id FROM fs_payment WHERE key = $1`, call.Key).Scan(&s.PaymentID)
	if errors.Is(err, pgx.ErrNoRows) {
		f.record(fmt.Sprintf("lookup:%d:missing", call.Number))
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f.record(fmt.Sprintf("lookup:%d:found", call.Number))
	return true, nil
}

func (f *fsFlow) book(ctx context.Context, tx engine.Tx, _ engine.Attempt, in fsIn, s *fsState) error {
	n := int(f.bookCalls.Add(1))
	if f.bookFault != nil {
		if err := f.bookFault(n); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO fs_booking (debit_id, payment_id) VALUES ($1, $2)`, s.DebitID, s.PaymentID)
	return err
}

func (f *fsFlow) result(in fsIn, s *fsState) (fsState, error) {
	if f.resultFault != nil {
		if err := f.resultFault(); err != nil {
			return fsState{}, err
		}
	}
	return *s, nil
}

// fsBooks is what the scratch tables hold.
type fsBooks struct {
	debits, reversals int
	// payments are the provider's payments; requests the calls it recorded.
	payments, requests int
	bookings           int
}

func fsReadBooks(t *testing.T, pool *pgxpool.Pool) fsBooks {
	t.Helper()
	ctx := context.Background()
	var b fsBooks
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT reversal), count(*) FILTER (WHERE reversal) FROM fs_ledger`).Scan(&b.debits, &b.reversals))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(requests), 0) FROM fs_payment`).Scan(&b.payments, &b.requests))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM fs_booking`).Scan(&b.bookings))
	return b
}

// fsPool returns a database of the test's own with the scratch tables.
func fsPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), fsSchema)
	require.NoError(t, err)
	return pool
}

// fsHurry makes the engine's scheduled resume jobs due now, every 20ms until
// the test ends. River's scheduler promotes scheduled jobs only every 5
// seconds, so each retry through River would otherwise take up to that long.
// It changes when a retry runs, never what it does.
func fsHurry(t *testing.T, pool *pgxpool.Pool) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			_, _ = pool.Exec(ctx, `UPDATE river_job SET state = 'available', scheduled_at = now()
				WHERE state = 'scheduled' AND kind = 'idemflow_resume'`)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

const fsTimeout = 20 * time.Second

func fsGet(t *testing.T, e *engine.Engine, id uuid.UUID) *engine.Info {
	t.Helper()
	info, err := e.Get(context.Background(), id)
	require.NoError(t, err)
	return info
}

// fsAwait waits until the operation satisfies cond, and returns it as read
// then.
func fsAwait(t *testing.T, e *engine.Engine, id uuid.UUID, what string, cond func(*engine.Info) bool) *engine.Info {
	t.Helper()
	require.Eventually(t, func() bool {
		info, err := e.Get(context.Background(), id)
		return err == nil && cond(info)
	}, fsTimeout, 10*time.Millisecond, "waiting for the operation: %s", what)
	return fsGet(t, e, id)
}

func fsParked(i *engine.Info) bool { return i.Parked }

// fsWait waits for the operation to finish.
func fsWait(t *testing.T, e *engine.Engine, id uuid.UUID) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fsTimeout)
	defer cancel()
	info, err := e.Wait(ctx, id)
	require.NoError(t, err)
	return info
}

func fsStatuses(info *engine.Info) []engine.StepStatus {
	out := make([]engine.StepStatus, len(info.Steps))
	for i, s := range info.Steps {
		out[i] = s.Status
	}
	return out
}

// fsGate holds the first attempt that match selects at its hook point until
// the test opens the gate (or the run's context ends).
type fsGate struct {
	match   func(faults.Event) bool
	hit     atomic.Bool
	reached chan faults.Event
	release chan struct{}
}

func newFSGate(match func(faults.Event) bool) *fsGate {
	return &fsGate{match: match, reached: make(chan faults.Event, 1), release: make(chan struct{})}
}

// fsAt selects the given attempt of step at point.
func fsAt(step string, point faults.Point, attempt int) func(faults.Event) bool {
	return func(ev faults.Event) bool {
		return ev.Step == step && ev.Point == point && ev.Attempt == attempt
	}
}

func (g *fsGate) hook(ctx context.Context, ev faults.Event) error {
	if !g.match(ev) || !g.hit.CompareAndSwap(false, true) {
		return nil
	}
	g.reached <- ev
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait waits until an attempt is held at the gate.
func (g *fsGate) wait(t *testing.T) faults.Event {
	t.Helper()
	select {
	case ev := <-g.reached:
		return ev
	case <-time.After(fsTimeout):
		require.FailNow(t, "no attempt reached the gate")
		return faults.Event{}
	}
}

func (g *fsGate) open() { close(g.release) }

// fsHooks calls each hook in turn, stopping at the first error.
func fsHooks(hooks ...faults.Hook) faults.Hook {
	return func(ctx context.Context, ev faults.Event) error {
		for _, h := range hooks {
			if err := h(ctx, ev); err != nil {
				return err
			}
		}
		return nil
	}
}

// fsResumeArgs is the engine's resume job as River stores it (kind
// idemflow_resume), enqueued by hand to check that a job does not take a
// parked operation up again.
type fsResumeArgs struct {
	OperationID uuid.UUID `json:"operation_id"`
	Operation   string    `json:"operation"`
}

func (fsResumeArgs) Kind() string { return "idemflow_resume" }

// fsResumeJobs counts the River jobs that resume an operation, in any state.
func fsResumeJobs(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'idemflow_resume'`).Scan(&n))
	return n
}

// fsNoMoreRuns checks, without waiting for time to pass, that nothing takes
// the operation up again: sweeps with its lease expired enqueue no resume job,
// and a resume job enqueued by hand ends without running anything. The
// engine's workers must be started.
func fsNoMoreRuns(t *testing.T, e *engine.Engine, pool *pgxpool.Pool, id uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	before := fsGet(t, e, id)
	n := fsResumeJobs(t, pool)
	for range 3 {
		_, err := pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, id)
		require.NoError(t, err)
		require.NoError(t, e.Sweep(ctx))
	}
	require.Equal(t, n, fsResumeJobs(t, pool), "a sweep enqueued a resume job for the operation")

	res, err := e.River().Insert(ctx, fsResumeArgs{OperationID: id, Operation: before.Name}, &river.InsertOpts{Queue: engine.DefaultQueue})
	require.NoError(t, err)
	var state string
	require.Eventually(t, func() bool {
		job, err := e.River().JobGet(ctx, res.Job.ID)
		if err != nil {
			return false
		}
		state = string(job.State)
		return state == "completed" || state == "retryable" || state == "discarded"
	}, fsTimeout, 10*time.Millisecond, "the resume job never ran")
	require.Equal(t, "completed", state)

	after := fsGet(t, e, id)
	require.Equal(t, before.Runs, after.Runs, "a run claimed the operation")
	require.Equal(t, before.Parked, after.Parked)
	require.Equal(t, before.Status, after.Status)
	for i := range before.Steps {
		require.Equal(t, before.Steps[i].Attempts, after.Steps[i].Attempts, "step %s was attempted again", before.Steps[i].Name)
	}
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
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease, InlineRetryMax: tc.inline, Test: faults.Config{Hook: gate.hook}}, op)
			fsHurry(t, pool)

			s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
			require.NoError(t, err)
			gate.wait(t) // attempt 4 of book, past MaxAttempts

			info := fsGet(t, e, s.ID)
			require.Equal(t, engine.StatusInProgress, info.Status)
			require.True(t, info.NeedsAttention())
			require.Equal(t, engine.CodeRetryingPastPivot, info.Attention.Code)
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
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	fsHurry(t, pool)

	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	info := fsAwait(t, e, s.ID, "parked", fsParked)
	require.Equal(t, engine.StatusInProgress, info.Status)
	require.True(t, info.NeedsAttention())
	require.Equal(t, engine.CodeFailedPastPivot, info.Attention.Code)
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
	require.Equal(t, engine.CodeFailedPastPivot, again.Attention.Code)
	require.Equal(t, engine.StatusInProgress, again.Status)
	require.Zero(t, f.debitUndos.Load())

	closed.Store(false)
	require.NoError(t, e.Retry(ctx, s.ID, nil), nil)
	done := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	got := fsGet(t, e, s.ID)
	require.Nil(t, got.Attention)
	require.False(t, got.Parked)
	require.Equal(t, int32(2), f.bookCalls.Load())
	require.Zero(t, f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
}

// fsCrashAt starts an operation on an engine of its own (no workers) whose
// hook holds the first attempt of step at point, then stops that engine so
// that the run is cancelled there, as a crash would leave it: what the step
// had done stays done, and what had not committed never does. It returns the
// operation's id once the engine has stopped.
func fsCrashAt(t *testing.T, pool *pgxpool.Pool, op *engine.Operation[fsIn, fsState, fsState], step string, point faults.Point) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	gate := newFSGate(fsAt(step, point, 1))
	a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease, Test: faults.Config{Hook: gate.hook}}, op)
	s, err := engine.Start(ctx, a, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	gate.wait(t)
	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.Stop(stopCtx), context.DeadlineExceeded)
	return s.ID
}

// TestCancelPastPivot: Cancel refuses, changing nothing, an operation whose
// pivot has succeeded, recorded or not (its lookup finds the call), and
// compensates one whose pivot's call did not go through.
func TestCancelPastPivot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CheckpointRecorded", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var busy atomic.Bool
		busy.Store(true)
		f := &fsFlow{
			pool:      pool,
			lookup:    true,
			bookRetry: engine.RetryPolicy{Base: time.Hour}, // the retry is an hour away
			bookFault: func(int) error {
				if busy.Load() {
					return errors.New("ledger busy")
				}
				return nil
			},
		}
		op := f.op(t, "cancel_recorded")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		before := fsAwait(t, e, s.ID, "book's first failure recorded", func(i *engine.Info) bool { return i.Steps[2].Attempts == 1 })

		_, err = e.Cancel(ctx, s.ID, "customer withdrew")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		info := fsGet(t, e, s.ID)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Equal(t, before.Runs, info.Runs)
		require.Equal(t, 1, info.Steps[2].Attempts)
		require.Nil(t, info.Error)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusRunning}, fsStatuses(info))
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		// The operation is as it was: its retry, brought forward, finishes it
		// once the fault clears.
		busy.Store(false)
		require.NoError(t, e.StartWorkers(ctx))
		fsHurry(t, pool)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("CallWentThroughCheckpointLost", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true}
		op := f.op(t, "cancel_crash_window")
		// The provider recorded the payment; the run was stopped before the
		// checkpoint, which rides with book's transaction, committed.
		id := fsCrashAt(t, pool, op, "pay", faults.PointAfterEffect)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		before := fsGet(t, b, id)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusPending, engine.StepStatusPending}, fsStatuses(before),
			"the rows must not know that the call went through")
		_, err := b.Cancel(ctx, id, "customer withdrew")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		require.Equal(t, int32(1), f.lookups.Load(), "Cancel must ask the lookup")
		info := fsGet(t, b, id)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Nil(t, info.Error)
		require.Equal(t, fsStatuses(before), fsStatuses(info))
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		// It goes forward: the lookup completes the payment without a second call.
		require.NoError(t, b.StartWorkers(ctx))
		done := fsWait(t, b, id)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, b, id)
		require.Equal(t, engine.ResolvedByLookup, got.Steps[1].ResolvedBy)
		require.Equal(t, int32(1), f.payCalls.Load())
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("CallNotMadeCompensates", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true}
		op := f.op(t, "cancel_before_call")
		id := fsCrashAt(t, pool, op, "pay", faults.PointBefore)
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		info, err := b.Cancel(ctx, id, "customer withdrew")
		require.NoError(t, err)
		require.Equal(t, int32(1), f.lookups.Load(), "Cancel must ask the lookup")
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, engine.CodeCancelled, info.Error.Code)
		require.Equal(t, "customer withdrew", info.Error.Cause)
		require.False(t, info.Error.ServerFault())
		require.Equal(t, int32(1), f.debitUndos.Load())
		require.Zero(t, f.payCalls.Load())
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))

		got := fsGet(t, b, id)
		require.Equal(t, engine.StatusFailed, got.Status)
		require.Equal(t, engine.CodeCancelled, got.Error.Code)
		require.Equal(t, "customer withdrew", got.Error.Cause)
		require.False(t, got.Error.ServerFault())
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusSkipped, engine.StepStatusSkipped}, fsStatuses(got))
	})
}

// TestExternalStepOutOfAttempts: an external step out of attempts asks its
// lookup after the last attempt; not found compensates and fails the
// operation, found goes forward; without a lookup the operation is parked and
// nothing is compensated.
func TestExternalStepOutOfAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	retry := engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3}

	t.Run("LookupFindsNothing", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(int) (bool, error) { return false, errors.New("provider unavailable") }}
		op := f.op(t, "out_not_found")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, info.Status)
		require.Equal(t, engine.CodeAttemptsExhausted, info.Error.Code)
		require.Equal(t, "pay", info.Error.Step)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:2:missing", "call:2", "lookup:3:missing", "call:3", "lookup:3:missing"}, events,
			"the lookup is asked before each retry and after the last attempt")
		require.Equal(t, int32(1), f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
		require.Equal(t, 3, got.Steps[1].Attempts)
	})

	t.Run("LookupFindsTheCall", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		// The provider is down for two attempts; the third records the payment,
		// and its answer is lost.
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(attempt int) (bool, error) {
				if attempt < 3 {
					return false, errors.New("provider unavailable")
				}
				return true, errors.New("answer lost")
			}}
		op := f.op(t, "out_found")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, info.Status, "error: %+v", info.Error)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:2:missing", "call:2", "lookup:3:missing", "call:3", "lookup:3:found"}, events)
		out, err := op.Result(info)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(out.PaymentID, "pay_"), "the lookup fills the state: %q", out.PaymentID)
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusSucceeded, engine.StepStatusSucceeded, engine.StepStatusSucceeded}, fsStatuses(got))
		require.Equal(t, engine.ResolvedByLookup, got.Steps[1].ResolvedBy)
		require.Equal(t, 3, got.Steps[1].Attempts)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("NoLookupParks", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, retry: retry,
			payFault: func(int) (bool, error) { return false, errors.New("provider unavailable") }}
		op := f.op(t, "out_unknown")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "parked", fsParked)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.True(t, info.NeedsAttention())
		require.Equal(t, engine.CodeOutcomeUnknown, info.Attention.Code)
		require.Nil(t, info.Error)
		require.Equal(t, 3, info.Steps[1].Attempts)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		fsNoMoreRuns(t, e, pool, s.ID)
		require.Equal(t, int32(3), f.payCalls.Load())

		// Nobody can tell whether the call went through: Cancel refuses too.
		_, err = e.Cancel(ctx, s.ID, "give up")
		require.ErrorIs(t, err, engine.ErrPastPivot)
		again := fsGet(t, e, s.ID)
		require.True(t, again.Parked)
		require.Equal(t, engine.CodeOutcomeUnknown, again.Attention.Code)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))
	})
}

// TestPanicsContained: a panic in user code fails its attempt, wherever the
// engine calls it (a transactional step in a first run and in a resumed one, a
// lookup, a compensation, the result function); the attempt is counted and
// its texts say so, and the operation ends as the rules say.
func TestPanicsContained(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	in := fsIn{Account: "acct", Amount: 100}
	retry := engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 5}

	t.Run("TxStepFirstAttempt", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, bookFault: func(n int) error {
			if n == 1 {
				panic("kaboom-tx-first")
			}
			return nil
		}}
		op := f.op(t, "panic_tx")
		gate := newFSGate(fsAt("book", faults.PointBefore, 2))
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease, Test: faults.Config{Hook: gate.hook}}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		info := fsGet(t, e, s.ID)
		book := info.Steps[2]
		require.Equal(t, 1, book.Attempts, "the panicking attempt is counted")
		require.Equal(t, engine.StepStatusRunning, book.Status)
		require.True(t, strings.HasPrefix(book.LastError, "panic"), "LastError: %q", book.LastError)
		require.NotContains(t, book.LastError, "kaboom-tx-first")
		require.Contains(t, book.LastCause, "kaboom-tx-first")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, e, s.ID)
		require.Equal(t, 1, got.Runs, "the run that panicked retried the step itself")
		require.Equal(t, 2, got.Steps[2].Attempts)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("TxStepResumedAttempt", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, bookFault: func(n int) error {
			switch n {
			case 1:
				return errors.New("ledger busy")
			case 2:
				panic("kaboom-tx-resumed")
			}
			return nil
		}}
		op := f.op(t, "panic_resumed")
		var mu sync.Mutex
		var seen []string
		trace := func(_ context.Context, ev faults.Event) error {
			if ev.Step == "book" && ev.Point == faults.PointBefore {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%d resumed=%t", ev.Attempt, ev.Resumed))
				mu.Unlock()
			}
			return nil
		}
		gate := newFSGate(fsAt("book", faults.PointBefore, 3))
		// The backoff (5ms) is longer than InlineRetryMax: a River job runs each retry.
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease, InlineRetryMax: time.Millisecond, Test: faults.Config{Hook: fsHooks(trace, gate.hook)}}, op)
		fsHurry(t, pool)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		info := fsGet(t, e, s.ID)
		book := info.Steps[2]
		require.Equal(t, 2, book.Attempts)
		require.True(t, strings.HasPrefix(book.LastError, "panic"), "LastError: %q", book.LastError)
		require.Contains(t, book.LastCause, "kaboom-tx-resumed")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		got := fsGet(t, e, s.ID)
		require.Equal(t, 3, got.Steps[2].Attempts)
		require.Equal(t, 3, got.Runs)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"1 resumed=false", "2 resumed=true", "3 resumed=true"}, seen,
			"each attempt once: the panic was an attempt of its own, in a resumed run")
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("Lookup", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(attempt int) (bool, error) {
				if attempt == 1 {
					return false, errors.New("provider unavailable")
				}
				return true, nil
			},
			lookupFault: func(attempt int) error {
				if attempt == 2 {
					panic("kaboom-lookup")
				}
				return nil
			},
		}
		op := f.op(t, "panic_lookup")
		gate := newFSGate(fsAt("pay", faults.PointBefore, 3))
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease, Test: faults.Config{Hook: gate.hook}}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		gate.wait(t)
		pay := fsGet(t, e, s.ID).Steps[1]
		require.Equal(t, 2, pay.Attempts, "the attempt whose lookup panicked is counted")
		require.True(t, strings.HasPrefix(pay.LastError, "panic"), "LastError: %q", pay.LastError)
		require.Contains(t, pay.LastCause, "kaboom-lookup")
		gate.open()
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		events, _ := f.recorded()
		require.Equal(t, []string{"call:1", "lookup:3:missing", "call:3"}, events, "no call after the lookup panicked")
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("LookupInCancel", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var panics atomic.Bool
		panics.Store(true)
		f := &fsFlow{pool: pool, lookup: true, lookupFault: func(int) error {
			if panics.Load() {
				panic("kaboom-cancel-lookup")
			}
			return nil
		}}
		op := f.op(t, "panic_cancel_lookup")
		id := fsCrashAt(t, pool, op, "pay", faults.PointBefore)
		b := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		_, err := b.Cancel(ctx, id, "customer withdrew")
		require.ErrorContains(t, err, "kaboom-cancel-lookup", "a lookup that cannot answer stops the cancel")
		info := fsGet(t, b, id)
		require.Equal(t, engine.StatusInProgress, info.Status)
		require.Nil(t, info.Error)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool))

		// Nothing was changed: it goes on once the lookup answers.
		panics.Store(false)
		require.NoError(t, b.StartWorkers(ctx))
		done := fsWait(t, b, id)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})

	t.Run("Compensation", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, retry: retry,
			payFault: func(int) (bool, error) { return false, engine.Fail("declined", "the provider declined the payment") },
			undoFault: func(n int) error {
				if n == 1 {
					panic("kaboom-undo")
				}
				return nil
			},
		}
		op := f.op(t, "panic_undo")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		fsHurry(t, pool)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, done.Status)
		require.Equal(t, "declined", done.Error.Code)
		require.Equal(t, int32(2), f.debitUndos.Load(), "the compensation that panicked is retried")
		require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool), "the panicking compensation's write rolled back")
		got := fsGet(t, e, s.ID)
		require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
	})

	t.Run("ResultBeforePivot", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		f := &fsFlow{pool: pool, lookup: true, undoablePay: true, retry: retry,
			resultFault: func() error { panic("kaboom-result") }}
		op := f.op(t, "panic_result")
		e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusFailed, done.Status)
		require.Equal(t, engine.CodeResultFailed, done.Error.Code)
		require.True(t, done.Error.ServerFault())
		require.Contains(t, done.Error.Cause, "kaboom-result")
		require.NotContains(t, done.Error.Message, "kaboom-result")
		require.Equal(t, int32(1), f.payUndos.Load())
		require.Equal(t, int32(1), f.debitUndos.Load())
		// book's writes rolled back with the result.
		require.Equal(t, fsBooks{debits: 1, reversals: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))
	})

	t.Run("ResultPastPivot", func(t *testing.T) {
		t.Parallel()
		pool := fsPool(t)
		var panics atomic.Bool
		panics.Store(true)
		f := &fsFlow{pool: pool, lookup: true, retry: retry, resultFault: func() error {
			if panics.Load() {
				panic("kaboom-result-past-pivot")
			}
			return nil
		}}
		op := f.op(t, "panic_result_pivot")
		e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
		s, err := engine.Start(ctx, e, op, "c", "k", in, nil)
		require.NoError(t, err)
		info := fsAwait(t, e, s.ID, "parked", fsParked)
		require.Equal(t, engine.CodeFailedPastPivot, info.Attention.Code)
		require.Contains(t, info.Attention.Reason, "kaboom-result-past-pivot")
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))

		panics.Store(false)
		require.NoError(t, e.Retry(ctx, s.ID, nil), nil)
		done := fsWait(t, e, s.ID)
		require.Equal(t, engine.StatusSucceeded, done.Status)
		require.Zero(t, f.debitUndos.Load())
		require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1, bookings: 1}, fsReadBooks(t, pool))
	})
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
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
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
			require.Equal(t, engine.CodeUndecodableState, info.Attention.Code)
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
				require.Equal(t, engine.CodeUndecodableState, again.Attention.Code)
				require.Zero(t, undos.Load())
				return
			}
			require.NoError(t, err)
			require.Equal(t, engine.StatusFailed, cancelled.Status)
			require.Equal(t, engine.CodeCancelled, cancelled.Error.Code)
			require.Equal(t, "stale deploy", cancelled.Error.Cause)
			got := fsGet(t, e, s.ID)
			require.Equal(t, engine.StatusFailed, got.Status)
			require.Equal(t, engine.CodeCancelled, got.Error.Code)
			require.Nil(t, got.Attention)
			require.False(t, got.Parked)
			require.Equal(t, int32(1), secondCalls.Load())
		})
	}
}

// fsNewOp declares a one-step operation over In, S and Out.
func fsNewOp[In, S, Out any]() error {
	_, err := engine.NewOperation("typed", []engine.Step[In, S]{
		engine.TxStep("only", func(context.Context, engine.Tx, engine.Attempt, In, *S) error { return nil }),
	}, func(In, *S) (Out, error) {
		var out Out
		return out, nil
	}, nil)
	return err
}

// fsRoles declares operations with T as the input, the state and the result.
func fsRoles[T any]() map[string]func() error {
	return map[string]func() error{
		"input":  fsNewOp[T, int, int],
		"state":  fsNewOp[int, T, int],
		"result": fsNewOp[int, int, T],
	}
}

type (
	fsBadUnexported struct {
		ID int `json:"id"`
		//lint:ignore U1000 the field encoding/json would drop is the point
		secret string
	}
	fsBadFunc struct {
		ID     int
		Notify func()
	}
	fsBadChan struct {
		Done chan int
	}
	fsBadComplex struct {
		Z complex128
	}
	fsBadMapKey struct {
		Rates map[float64]string
	}
	fsBadNested struct {
		Inner struct {
			Items []struct{ Phase complex128 }
		}
	}
	fsGoodInner struct {
		Name string     `json:"name"`
		When *time.Time `json:"when"`
	}
	fsGood struct {
		At      time.Time              `json:"at"`
		Raw     json.RawMessage        `json:"raw"`
		ID      uuid.UUID              `json:"id"`
		P       *int                   `json:"p"`
		PP      **string               `json:"pp"`
		Nested  fsGoodInner            `json:"nested"`
		NP      *fsGoodInner           `json:"np"`
		List    []fsGoodInner          `json:"list"`
		ByName  map[string]fsGoodInner `json:"byName"`
		ByID    map[int]string         `json:"byId"`
		Any     any                    `json:"any"`
		Skipped func()                 `json:"-"`
		fsGoodInner
	}
)

// TestNewOperationTypeChecks: NewOperation refuses an input, state or result
// type that does not survive encoding/json, naming the role and the field, and
// accepts the types that do.
func TestNewOperationTypeChecks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		roles map[string]func() error
		field string
	}{
		{"UnexportedField", fsRoles[fsBadUnexported](), "secret"},
		{"FuncField", fsRoles[fsBadFunc](), "Notify"},
		{"ChanField", fsRoles[fsBadChan](), "Done"},
		{"ComplexField", fsRoles[fsBadComplex](), "Z"},
		{"FloatMapKey", fsRoles[fsBadMapKey](), "Rates"},
		{"Nested", fsRoles[fsBadNested](), "Inner.Items[].Phase"},
	} {
		for role, newOp := range tc.roles {
			t.Run(tc.name+"/"+role, func(t *testing.T) {
				t.Parallel()
				err := newOp()
				require.Error(t, err)
				require.ErrorContains(t, err, role+" type")
				require.ErrorContains(t, err, "field "+tc.field+":")
			})
		}
	}
	for role, newOp := range fsRoles[fsGood]() {
		t.Run("Accepted/"+role, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, newOp())
		})
	}
	t.Run("AcceptedTopLevel", func(t *testing.T) {
		t.Parallel()
		require.NoError(t, fsNewOp[time.Time, json.RawMessage, *fsGood]())
		require.NoError(t, fsNewOp[*int, []fsGoodInner, map[string]time.Time]())
	})
}

// TestFenceByRun: a run that lost its operation to another run, which then
// failed the step for good, writes nothing when it goes on: not its step's
// writes, not its checkpoint, not its failure records, whichever way its
// attempt ends. Run A is held at the step before it has sent anything (so
// it holds no lock on the operation's row), its lease is made to run out (by
// SQL: a pause, as of a process stopped for a while, without A noticing), and
// run B, in another engine, takes the operation over, fails the step,
// compensates and ends the operation. Then A goes on.
func TestFenceByRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// work is run A's step once it goes on.
		work func(ctx context.Context, tx engine.Tx) error
	}{
		{"Succeeds", func(ctx context.Context, tx engine.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('A')`)
			return err
		}},
		{"SucceedsAtCommit", func(ctx context.Context, tx engine.Tx) error {
			_, err := engine.AtCommit(tx).Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('A')`)
			return err
		}},
		{"FailsTransiently", func(context.Context, engine.Tx) error { return errors.New("A: flaky") }},
		{"FailsForGood", func(context.Context, engine.Tx) error { return engine.Fail("a_refuses", "A refuses") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			_, err := pool.Exec(ctx, `CREATE TABLE fs_fence (run text NOT NULL)`)
			require.NoError(t, err)
			var undos atomic.Int32
			opA := fsFencedOp(t, &undos, func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
				return tc.work(ctx, tx)
			})
			opB := fsFencedOp(t, &undos, func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
				return engine.Fail("b_refuses", "B refuses")
			})

			gate := newFSGate(fsAt("work", faults.PointBefore, 1))
			// A's lease is long enough that it never renews during the test.
			a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: time.Hour, Test: faults.Config{Hook: gate.hook}}, opA)
			b := idemflowtest.Engine(t, pool, &engine.Config{Lease: time.Second}, opB)

			s, err := engine.Start(ctx, a, opA, "c", "k", 1, nil)
			require.NoError(t, err)
			gate.wait(t)
			_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
			require.NoError(t, err)
			byB := fsWait(t, b, s.ID)
			require.Equal(t, engine.StatusFailed, byB.Status)
			require.Equal(t, "b_refuses", byB.Error.Code)

			type stepRow struct {
				state, lastError, lastCause string
				attempts                    int
			}
			readWork := func() stepRow {
				var r stepRow
				require.NoError(t, pool.QueryRow(ctx, `SELECT state, attempts, coalesce(last_error, ''), coalesce(last_cause, '')
					FROM idemflow_step_row WHERE operation_id = $1 AND name = 'work'`, s.ID).Scan(&r.state, &r.attempts, &r.lastError, &r.lastCause))
				return r
			}
			asB := readWork()
			require.Equal(t, "failed", asB.state)
			require.Equal(t, "B refuses", asB.lastError)

			// A goes on, and its run ends: Stop returns once it has.
			gate.open()
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, a.Stop(stopCtx))

			require.Equal(t, asB, readWork(), "the stale run rewrote the step B failed")
			require.Equal(t, []string{"undo"}, fsFenceRows(t, pool), "only B's compensation wrote")
			require.Equal(t, int32(1), undos.Load())
			got := fsGet(t, b, s.ID)
			require.Equal(t, engine.StatusFailed, got.Status)
			require.Equal(t, "b_refuses", got.Error.Code)
			require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(got))
			require.Equal(t, 2, got.Runs)
		})
	}
}

// fsFencedOp is the operation of the fence tests: prep, whose compensation
// writes "undo" to fs_fence and counts in undos, work, and finish.
func fsFencedOp(t *testing.T, undos *atomic.Int32, work engine.TxFunc[int, int]) *engine.Operation[int, int, int] {
	t.Helper()
	op, err := engine.NewOperation("fenced", []engine.Step[int, int]{
		engine.TxStep("prep", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).Compensate(func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			undos.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ('undo')`)
			return err
		}),
		engine.TxStep("work", work),
		// work is not the last step: the last one's commit ends the
		// operation, and that statement is fenced on its own.
		engine.TxStep("finish", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }),
	}, func(in int, s *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3}})
	require.NoError(t, err)
	return op
}

// fsFenceRows returns what fs_fence holds, sorted.
func fsFenceRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	r, err := pool.Query(context.Background(), `SELECT run FROM fs_fence ORDER BY run`)
	require.NoError(t, err)
	rows, err := pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	return rows
}

// TestFenceByRunWhileNewHolderWorks: a run that lost its operation writes
// nothing while the run that took it over is still at the same step, before
// that run has written anything either: only the fence by run tells the two
// apart (no checkpoint of the new holder's is there to collide with).
func TestFenceByRunWhileNewHolderWorks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE fs_fence (run text NOT NULL)`)
	require.NoError(t, err)
	var undos atomic.Int32
	write := func(run string) engine.TxFunc[int, int] {
		return func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, `INSERT INTO fs_fence (run) VALUES ($1)`, run)
			return err
		}
	}
	opA, opB := fsFencedOp(t, &undos, write("A")), fsFencedOp(t, &undos, write("B"))
	gateA := newFSGate(fsAt("work", faults.PointBefore, 1))
	gateB := newFSGate(func(ev faults.Event) bool {
		return ev.Step == "work" && ev.Point == faults.PointBefore && ev.Resumed
	})
	a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: time.Hour, Test: faults.Config{Hook: gateA.hook}}, opA)
	b := idemflowtest.Engine(t, pool, &engine.Config{Lease: 5 * time.Second, Test: faults.Config{Hook: gateB.hook}}, opB)

	s, err := engine.Start(ctx, a, opA, "c", "k", 1, nil)
	require.NoError(t, err)
	gateA.wait(t)
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	gateB.wait(t) // B holds the operation, at the same step, and has sent nothing

	gateA.open()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, a.Stop(stopCtx))
	require.Empty(t, fsFenceRows(t, pool), "the stale run wrote while another run held the operation")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_step_row WHERE operation_id = $1 AND name = 'work'`, s.ID).Scan(&rows))
	require.Zero(t, rows, "the stale run checkpointed the step")

	gateB.open()
	done := fsWait(t, b, s.ID)
	require.Equal(t, engine.StatusSucceeded, done.Status)
	require.Equal(t, []string{"B"}, fsFenceRows(t, pool))
	require.Equal(t, 2, fsGet(t, b, s.ID).Runs)
	require.Zero(t, undos.Load())
}

type fsOrder struct {
	Amount   int64          `json:"amount"`
	Currency string         `json:"currency"`
	Order    string         `json:"order"`
	Note     string         `json:"note"`
	Meta     map[string]int `json:"meta"`
	Ref      string         `json:"ref,omitempty"`
}

// TestKeyReuse: a start under a held key with another input is refused with
// a *KeyReusedError that names exactly the top-level fields that differ, but
// the unfingerprinted ones; the same input (up to those) gets the existing
// operation. Start and StartTx alike.
func TestKeyReuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	define := func(name string) *engine.Operation[fsOrder, int, int] {
		op, err := engine.NewOperation(name, []engine.Step[fsOrder, int]{
			engine.TxStep("noop", func(context.Context, engine.Tx, engine.Attempt, fsOrder, *int) error { return nil }),
		}, func(in fsOrder, _ *int) (int, error) { return int(in.Amount), nil }, &engine.OperationOpts{Unfingerprinted: []string{"note"}})
		require.NoError(t, err)
		return op
	}
	op, other := define("order"), define("other_order")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op, other)
	first := fsOrder{Amount: 100, Currency: "EUR", Order: "o-1", Note: "first", Meta: map[string]int{"a": 1, "b": 2}}
	held, err := engine.Start(ctx, e, op, "c", "k", first, nil)
	require.NoError(t, err)
	require.True(t, held.Created)
	done := fsWaitStarted(t, held)
	require.Equal(t, engine.StatusSucceeded, done.Status)

	// A second operation holds a key reserved with StartTx, not run yet.
	var heldTx *engine.Started
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		heldTx, err = engine.StartTx(ctx, tx, e, op, "c", "k-tx", first, nil)
		return err
	}))
	require.True(t, heldTx.Created)

	refused := func(t *testing.T, err error, id uuid.UUID, fields ...string) {
		t.Helper()
		require.ErrorIs(t, err, engine.ErrKeyReused)
		var kre *engine.KeyReusedError
		require.ErrorAs(t, err, &kre)
		require.Equal(t, id, kre.ID)
		require.Equal(t, fields, kre.Fields)
	}
	with := func(change func(*fsOrder)) fsOrder {
		in := first
		in.Meta = map[string]int{"a": 1, "b": 2}
		change(&in)
		return in
	}

	for _, tc := range []struct {
		name   string
		in     fsOrder
		fields []string // nil: the same start
	}{
		{"FieldsThatDiffer", with(func(in *fsOrder) { in.Amount, in.Order, in.Note = 101, "o-2", "second" }), []string{"amount", "order"}},
		{"NestedValueAndAddedField", with(func(in *fsOrder) { in.Meta["b"], in.Ref = 3, "r-1" }), []string{"meta", "ref"}},
		{"UnfingerprintedOnly", with(func(in *fsOrder) { in.Note = "changed" }), nil},
		{"SameInput", with(func(*fsOrder) {}), nil},
	} {
		t.Run("Start/"+tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := engine.Start(ctx, e, op, "c", "k", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, held.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, held.ID, s.ID)
			require.Equal(t, held.ID, s.Existing.ID)
			require.Equal(t, engine.StatusSucceeded, s.Existing.Status)
			require.JSONEq(t, string(done.Result), string(s.Existing.Result))
		})
		t.Run("StartTx/"+tc.name, func(t *testing.T) {
			t.Parallel()
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { require.NoError(t, tx.Rollback(ctx)) }()
			s, err := engine.StartTx(ctx, tx, e, op, "c", "k", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, held.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, held.ID, s.Existing.ID)
			require.Equal(t, engine.StatusSucceeded, s.Existing.Status)
		})
		t.Run("StartOnStartTxKey/"+tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := engine.Start(ctx, e, op, "c", "k-tx", tc.in, nil)
			if tc.fields != nil {
				refused(t, err, heldTx.ID, tc.fields...)
				return
			}
			require.NoError(t, err)
			require.False(t, s.Created)
			require.Equal(t, heldTx.ID, s.Existing.ID)
			require.Equal(t, engine.StatusInProgress, s.Existing.Status)
		})
	}

	t.Run("OtherOperationType", func(t *testing.T) {
		t.Parallel()
		_, err := engine.Start(ctx, e, other, "c", "k", first, nil)
		refused(t, err, held.ID, "operation")
	})
}

// fsWaitStarted waits for a started operation to finish.
func fsWaitStarted(t *testing.T, s *engine.Started) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), fsTimeout)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	return info
}

// TestClientFacingTexts: a failure whose error names SQL, a URL and a file
// keeps them from the client's texts (StepInfo.LastError, the operation's
// Error.Message) and gives them to operators (LastCause, Error.Cause).
func TestClientFacingTexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	_, err := pool.Exec(ctx, `CREATE TABLE fs_text (id int PRIMARY KEY); INSERT INTO fs_text VALUES (1)`)
	require.NoError(t, err)
	const insert = `INSERT INTO fs_text (id) VALUES (1)`
	op, err := engine.NewOperation("texts", []engine.Step[int, int]{
		engine.TxStep("write", func(ctx context.Context, tx engine.Tx, _ engine.Attempt, _ int, _ *int) error {
			_, err := tx.Exec(ctx, insert)
			return fmt.Errorf("POST http://10.0.0.1/x, config /etc/passwd: %s: %w", insert, err)
		}),
	}, func(in int, _ *int) (int, error) { return in, nil },
		&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 2}})
	require.NoError(t, err)
	gate := newFSGate(fsAt("write", faults.PointBefore, 2))
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease, Test: faults.Config{Hook: gate.hook}}, op)
	internals := []string{"duplicate key", "fs_text_pkey", "23505", insert, "http://10.0.0.1/x", "10.0.0.1", "/etc/passwd"}
	clean := func(t *testing.T, client, operator string) {
		t.Helper()
		require.NotEmpty(t, client)
		for _, s := range internals {
			require.NotContains(t, client, s, "the client's text names something internal")
			require.Contains(t, operator, s, "the operator's text lacks the cause")
		}
	}

	s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
	require.NoError(t, err)
	gate.wait(t)
	retrying := fsGet(t, e, s.ID).Steps[0]
	require.Equal(t, engine.StepStatusRunning, retrying.Status)
	clean(t, retrying.LastError, retrying.LastCause)

	gate.open()
	done := fsWaitStarted(t, s)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Equal(t, engine.CodeAttemptsExhausted, done.Error.Code)
	require.True(t, done.Error.ServerFault())
	clean(t, done.Error.Message, done.Error.Cause)

	stored, err := e.GetByKey(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, engine.CodeAttemptsExhausted, stored.Error.Code)
	require.True(t, stored.Error.ServerFault())
	clean(t, stored.Error.Message, stored.Error.Cause)
	failed := fsGet(t, e, s.ID).Steps[0]
	require.Equal(t, engine.StepStatusFailed, failed.Status)
	require.Equal(t, 2, failed.Attempts)
	clean(t, failed.LastError, failed.LastCause)
}

// TestHaltParks: a step that returns engine.Halt parks its operation with the
// halt's code: not compensated (though before the pivot), not attempted again,
// until an operator retries it (it finishes) or cancels it (compensated).
func TestHaltParks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		external bool
		cancel   bool
	}{
		{"TxStepRetried", false, false},
		{"ExternalStepRetried", true, false},
		{"TxStepCancelled", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := fsPool(t)
			var halting atomic.Bool
			halting.Store(true)
			var undos, checks, confirms atomic.Int32
			check := func() error {
				checks.Add(1)
				if halting.Load() {
					return engine.Halt("provider_mismatch", "the provider paid another amount")
				}
				return nil
			}
			var checkStep engine.Step[int, int] = engine.TxStep("check", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return check() })
			if tc.external {
				checkStep = engine.ExternalStep("check", func(context.Context, engine.Attempt, int, *int) error { return check() })
			}
			op, err := engine.NewOperation("halting", []engine.Step[int, int]{
				engine.TxStep("reserve", func(context.Context, engine.Tx, engine.Attempt, int, *int) error { return nil }).Compensate(func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
					undos.Add(1)
					return nil
				}),
				checkStep,
				engine.TxStep("confirm", func(context.Context, engine.Tx, engine.Attempt, int, *int) error {
					confirms.Add(1)
					return nil
				}),
			}, func(in int, _ *int) (int, error) { return in, nil },
				&engine.OperationOpts{Retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 5}})
			require.NoError(t, err)
			e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)

			s, err := engine.Start(ctx, e, op, "c", "k", 1, nil)
			require.NoError(t, err)
			// Wait does not wait for an operator.
			waitCtx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
			defer cancelWait()
			waited, err := s.Wait(waitCtx)
			require.NoError(t, err)
			require.True(t, waited.Parked)
			require.Equal(t, engine.StatusInProgress, waited.Status)
			waited, err = e.Wait(waitCtx, s.ID)
			require.NoError(t, err)
			require.True(t, waited.Parked)
			info := fsAwait(t, e, s.ID, "parked", fsParked)
			require.Equal(t, engine.StatusInProgress, info.Status)
			require.True(t, info.NeedsAttention())
			require.Equal(t, "provider_mismatch", info.Attention.Code)
			require.Contains(t, info.Attention.Reason, "the provider paid another amount")
			require.Equal(t, 1, info.Steps[1].Attempts)
			require.Zero(t, undos.Load(), "a halt compensates nothing")

			fsNoMoreRuns(t, e, pool, s.ID)
			require.Equal(t, int32(1), checks.Load(), "a halted operation was attempted again")
			require.Zero(t, confirms.Load())
			require.Zero(t, undos.Load())

			halting.Store(false)
			if tc.cancel {
				cancelled, err := e.Cancel(ctx, s.ID, "operator: mismatch confirmed")
				require.NoError(t, err)
				require.Equal(t, engine.StatusFailed, cancelled.Status)
				require.Equal(t, engine.CodeCancelled, cancelled.Error.Code)
				require.Equal(t, int32(1), undos.Load())
				require.Equal(t, int32(1), checks.Load())
				return
			}
			require.NoError(t, e.Retry(ctx, s.ID, nil), nil)
			done := fsWait(t, e, s.ID)
			require.Equal(t, engine.StatusSucceeded, done.Status)
			got := fsGet(t, e, s.ID)
			require.Nil(t, got.Attention)
			require.False(t, got.Parked)
			require.Equal(t, int32(2), checks.Load())
			require.Equal(t, int32(1), confirms.Load())
			require.Zero(t, undos.Load())
		})
	}
}

// TestDerivedKeyAfterRetention: a client key used again after retention
// deleted its operation starts an operation whose external steps get new
// derived keys, so the provider never takes the new call for the old one.
func TestDerivedKeyAfterRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true}
	op := f.op(t, "retained")
	e := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	in := fsIn{Account: "acct", Amount: 100}

	first, err := engine.Start(ctx, e, op, "c", "K", in, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusSucceeded, fsWaitStarted(t, first).Status)
	firstKey := fsGet(t, e, first.ID).Steps[1].DerivedKey
	_, keys := f.recorded()
	require.Equal(t, []string{firstKey}, keys)

	future := time.Now().Add(48 * time.Hour)
	n, err := e.DeleteFinished(ctx, &future)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = e.Get(ctx, first.ID)
	require.ErrorIs(t, err, engine.ErrNotFound)

	second, err := engine.Start(ctx, e, op, "c", "K", in, nil)
	require.NoError(t, err)
	require.True(t, second.Created)
	require.NotEqual(t, first.ID, second.ID)
	require.Equal(t, engine.StatusSucceeded, fsWaitStarted(t, second).Status)
	_, keys = f.recorded()
	require.Len(t, keys, 2)
	require.NotEqual(t, keys[0], keys[1], "the key's new operation got the old derived key")
	for _, k := range keys {
		require.True(t, strings.HasPrefix(k, "idf3_"), "key %q", k)
		require.True(t, strings.HasPrefix(k, "idf3_"), "key %q", k)
	}
	require.Equal(t, keys[1], fsGet(t, e, second.ID).Steps[1].DerivedKey)
	require.Equal(t, fsBooks{debits: 2, payments: 2, requests: 2, bookings: 2}, fsReadBooks(t, pool))
}

// TestCompensationRetriesBoundedAcrossRuns: a compensation that keeps failing
// transiently is retried while the compensated step's policy allows, then
// parks the operation, half undone, for an operator, "rather than retrying
// forever" (run.compensationFailed). Every retry of a compensation is a River
// job, so the bound must hold across runs. The operator's retry, once the
// cause is mended, goes on compensating: it does not run the operation
// forward, and its error stays the step's.
func TestCompensationRetriesBoundedAcrossRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	const maxAttempts = 3
	var broken atomic.Bool
	broken.Store(true)
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: maxAttempts},
		payFault: func(int) (bool, error) { return false, engine.Fail("declined", "the provider declined the payment") },
		undoFault: func(int) error {
			if broken.Load() {
				return errors.New("ledger unavailable")
			}
			return nil
		},
	}
	op := f.op(t, "undo_fails")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	fsHurry(t, pool)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	// Until it stops, or the compensation has run more often than allowed.
	info := fsAwait(t, e, s.ID, "parked, finished, or compensated too often", func(i *engine.Info) bool {
		return i.Parked || i.Status != engine.StatusInProgress || f.debitUndos.Load() > maxAttempts
	})
	require.Equal(t, engine.StatusInProgress, info.Status, "a half-undone operation answered (after %d attempts of the compensation, MaxAttempts %d)", f.debitUndos.Load(), maxAttempts)
	require.True(t, info.Parked)
	require.True(t, info.NeedsAttention())
	require.Equal(t, engine.CodeCompensationFailed, info.Attention.Code)
	require.Contains(t, info.Attention.Reason, "debit")
	require.Equal(t, int32(maxAttempts), f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool), "a failed compensation writes nothing")
	fsNoMoreRuns(t, e, pool, s.ID)
	require.Equal(t, int32(maxAttempts), f.debitUndos.Load(), "a parked operation was compensated again")

	broken.Store(false)
	require.NoError(t, e.Retry(ctx, s.ID, nil), nil)
	done := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, done.Status)
	require.Equal(t, "declined", done.Error.Code, "the reopened operation lost its error")
	require.Equal(t, int32(1), f.payCalls.Load(), "the reopened operation ran forward")
	require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
	require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusFailed, engine.StepStatusSkipped}, fsStatuses(fsGet(t, e, s.ID)))
}

// TestReopenRefusesCompensatedCall: an operation whose external step was
// compensated is not run forward again: under the same derived key its call
// would be answered with the one that was undone, and the step would read as
// done. Retry refuses, changing nothing; a new key asks again.
func TestReopenRefusesCompensatedCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true, undoablePay: true, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 3},
		bookFault: func(int) error { return engine.Permanent(errors.New("the books are closed")) },
	}
	op := f.op(t, "undo_call")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	failed := fsWait(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, failed.Status)
	require.Equal(t, engine.CodePermanent, failed.Error.Code)
	require.Equal(t, int32(1), f.payUndos.Load())
	before := fsStatuses(fsGet(t, e, s.ID))
	require.Equal(t, []engine.StepStatus{engine.StepStatusCompensated, engine.StepStatusCompensated, engine.StepStatusFailed}, before)

	// A server fault reopens only when forced.
	require.ErrorIs(t, e.Retry(ctx, s.ID, nil), engine.ErrFinal)
	err = e.Retry(ctx, s.ID, &engine.RetryOpts{Force: true})
	require.ErrorIs(t, err, engine.ErrCompensated)
	require.Contains(t, err.Error(), "pay")
	fsNoMoreRuns(t, e, pool, s.ID)
	after := fsGet(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, after.Status)
	require.Equal(t, engine.CodePermanent, after.Error.Code)
	require.Equal(t, before, fsStatuses(after))
	require.Equal(t, int32(1), f.payCalls.Load())
	require.Equal(t, fsBooks{debits: 1, reversals: 1, payments: 1, requests: 1}, fsReadBooks(t, pool))
}

// TestRefusedCancelKeepsBackoff: a cancel refused after it claimed the
// operation (the lookup found the pivot's call went through) hands it back
// waiting out its backoff as before, not to the next sweep: the step is not
// tried again early.
func TestRefusedCancelKeepsBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5},
		// The provider records the payment, and the answer is lost.
		payFault: func(int) (bool, error) { return true, errors.New("connection reset") },
	}
	op := f.op(t, "cancel_backoff")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	fsAwait(t, e, s.ID, "waiting out its backoff", func(i *engine.Info) bool {
		return len(i.Steps) == 3 && i.Steps[1].Status == engine.StepStatusRunning && i.Steps[1].Attempts == 1
	})
	leftUntil := func() time.Time {
		var until time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT locked_until FROM idemflow_operation WHERE id = $1`, s.ID).Scan(&until))
		return until
	}
	before := leftUntil()
	require.Greater(t, time.Until(before), 50*time.Minute)

	_, err = e.Cancel(ctx, s.ID, "give up")
	require.ErrorIs(t, err, engine.ErrPastPivot)
	require.Equal(t, int32(1), f.lookups.Load())
	require.WithinDuration(t, before, leftUntil(), time.Second, "the refused cancel moved the operation's wait")
	n := fsResumeJobs(t, pool)
	for range 3 {
		require.NoError(t, e.Sweep(ctx))
	}
	require.Equal(t, n, fsResumeJobs(t, pool), "a sweep enqueued a resume job for the operation")
	require.Equal(t, int32(1), f.payCalls.Load(), "the step was tried again before its backoff")
	require.Equal(t, int32(1), f.lookups.Load())
	require.Equal(t, fsBooks{debits: 1, payments: 1, requests: 1}, fsReadBooks(t, pool), "the paid debit was not undone")
}

// TestAdminCancelOutlastsLease: a cancel request whose compensation takes
// longer than a lease stays with the process carrying it out: another
// process does not take it again, find the operation running, and record it
// refused while it is being cancelled.
func TestAdminCancelOutlastsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	const lease = 300 * time.Millisecond
	f := &fsFlow{pool: pool, lookup: true, retry: engine.RetryPolicy{Base: time.Hour, Cap: time.Hour, MaxAttempts: 5},
		payFault: func(int) (bool, error) { return false, errors.New("connection refused") },
		undoFault: func(int) error {
			time.Sleep(4 * lease)
			return nil
		},
	}
	op := f.op(t, "cancel_slow")
	cfg := &engine.Config{Lease: lease}
	e := idemflowtest.Engine(t, pool, cfg, op)
	idemflowtest.Engine(t, pool, cfg, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	fsAwait(t, e, s.ID, "waiting out its backoff", func(i *engine.Info) bool {
		return len(i.Steps) == 3 && i.Steps[1].Attempts == 1
	})

	admin, err := engine.NewAdmin(ctx, pool)
	require.NoError(t, err)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := admin.Cancel(waitCtx, s.ID, "give up")
	require.NoError(t, err)
	require.Equal(t, "done", req.Outcome, req.Message)
	info := fsGet(t, e, s.ID)
	require.Equal(t, engine.StatusFailed, info.Status)
	require.Equal(t, engine.CodeCancelled, info.Error.Code)
	require.Equal(t, int32(1), f.debitUndos.Load())
	require.Equal(t, fsBooks{debits: 1, reversals: 1}, fsReadBooks(t, pool))
}

// TestReopenRefusesAHeldOperation: a parked operation that a live run holds
// (an operator's cancel, compensating it) is not reopened under it.
func TestReopenRefusesAHeldOperation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fsPool(t)
	f := &fsFlow{pool: pool, retry: engine.RetryPolicy{Base: 5 * time.Millisecond, MaxAttempts: 2},
		payFault: func(int) (bool, error) { return false, errors.New("connection reset") },
	}
	op := f.op(t, "held")
	e := idemflowtest.Engine(t, pool, &engine.Config{Lease: engine.DefaultLease}, op)
	s, err := engine.Start(ctx, e, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	// Out of attempts with no lookup: parked, its outcome unknown.
	info := fsAwait(t, e, s.ID, "parked", fsParked)
	require.Equal(t, engine.CodeOutcomeUnknown, info.Attention.Code)

	// As a cancel's claim leaves it while it compensates.
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_by = gen_random_uuid(), locked_until = now() + interval '1 hour' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	require.ErrorIs(t, e.Retry(ctx, s.ID, nil), engine.ErrRunning)
	again := fsGet(t, e, s.ID)
	require.True(t, again.Parked, "reopened under its holder")
	require.Equal(t, fsBooks{debits: 1}, fsReadBooks(t, pool), "nothing undone while the outcome is unknown")

	// Its holder gone (the lease expired), it reopens.
	_, err = pool.Exec(ctx, `UPDATE idemflow_operation SET locked_until = now() - interval '1 second' WHERE id = $1`, s.ID)
	require.NoError(t, err)
	require.NoError(t, e.Retry(ctx, s.ID, nil), nil)
}
