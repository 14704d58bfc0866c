package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
)

// fsFlow is the operation of most failure tests (run_failure_test.go,
// cancel_test.go, step_errors_test.go, fence_test.go, ...): debit (a
// transactional step with a compensation), pay (an external step without one,
// so the pivot) and book (a transactional step), over scratch tables, with
// faults injected per attempt. The engines of these tests have the engine's
// default lease (Lease: defaultLease, 15 seconds) where idemflowtest's
// is a second: a run held at a gate is taken over only when the test expires
// its lease itself.

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
	// settle is pay's outcome window: none unless a test sets one.
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
	// when the call returns (no outcome window) unless they set one.
	pay := engine.ExternalStep("pay", f.pay).Window(f.settle)
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

// fsCrashAt starts an operation on an engine of its own (no workers) whose
// hook holds the first attempt of step at point, then stops that engine so
// that the run is cancelled there, as a crash would leave it: what the step
// had done stays done, and what had not committed never does. It returns the
// operation's id once the engine has stopped.
func fsCrashAt(t *testing.T, pool *pgxpool.Pool, op *engine.Operation[fsIn, fsState, fsState], step string, point faults.Point) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	gate := newFSGate(fsAt(step, point, 1))
	a := idemflowtest.NewEngine(t, pool, &engine.Config{Lease: defaultLease, Faults: engine.Faults{Hook: gate.hook}}, op)
	s, err := engine.Start(ctx, a, op, "c", "k", fsIn{Account: "acct", Amount: 100}, nil)
	require.NoError(t, err)
	gate.wait(t)
	stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.Stop(stopCtx), context.DeadlineExceeded)
	return s.ID
}
