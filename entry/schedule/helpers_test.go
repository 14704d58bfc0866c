package schedule_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/schedule"
	"github.com/idemflow/idemflow/idemflowtest"
)

// quiet keeps the engines' and River's info lines out of the test output.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// feeIn is the input of the scheduled fee: the slot it charges for, and the
// fee, both derived from the slot.
type feeIn struct {
	Slot time.Time `json:"slot"`
	Fee  int64     `json:"fee"`
}

type feeState struct {
	ChargeID int64 `json:"chargeId"`
}

type feeOut struct {
	ChargeID int64 `json:"chargeId"`
}

// closedPrefix starts the scopes whose fee fails for good.
const closedPrefix = "closed-"

// createCharges makes the table the fee writes to: one row per charge, and no
// unique constraint, so that a second charge for one slot would show.
func createCharges(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE fee_charge (
		id           bigserial   PRIMARY KEY,
		operation    text        NOT NULL,
		scope        text        NOT NULL,
		slot         timestamptz NOT NULL,
		fee          bigint      NOT NULL,
		operation_id uuid        NOT NULL
	)`)
	return err
}

// newFee returns a scheduled fee operation type named name: a transactional
// step that records one charge.
func newFee(t *testing.T, name string) *engine.Operation[feeIn, feeState, feeOut] {
	t.Helper()
	return newFeeKept(t, name, 0)
}

// newFeeKept is newFee with a retention of its own (zero: the engine's).
func newFeeKept(t *testing.T, name string, retention time.Duration) *engine.Operation[feeIn, feeState, feeOut] {
	t.Helper()
	charge := func(ctx context.Context, tx engine.Tx, at engine.Attempt, in feeIn, s *feeState) error {
		if strings.HasPrefix(at.Scope, closedPrefix) {
			return engine.Fail("account_closed", "the account is closed")
		}
		return tx.QueryRow(ctx, `INSERT INTO fee_charge (operation, scope, slot, fee, operation_id)
			VALUES ($1, $2, $3, $4, $5) RETURNING id`,
			at.Operation, at.Scope, in.Slot, in.Fee, at.OperationID).Scan(&s.ChargeID)
	}
	op, err := engine.NewOperation(name, []engine.Step[feeIn, feeState]{
		engine.TxStep("charge", charge),
	}, func(_ feeIn, s *feeState) (feeOut, error) { return feeOut(*s), nil }, &engine.OperationOpts{Retention: retention})
	require.NoError(t, err)
	return op
}

// bundle is a database with two engines on it, each with a pool of its own,
// as two processes have.
type bundle struct {
	pool    *pgxpool.Pool
	engines [2]*engine.Engine
	fee     *engine.Operation[feeIn, feeState, feeOut]
	// interest is a second scheduled operation type, registered too.
	interest *engine.Operation[feeIn, feeState, feeOut]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{
		pool:     idemflowtest.Pool(t, createCharges),
		fee:      newFee(t, "fee"),
		interest: newFee(t, "interest"),
	}
	cfg := &engine.Config{Logger: quiet}
	b.engines[0] = idemflowtest.Engine(t, b.pool, cfg, b.fee, b.interest)
	second, err := pgxpool.NewWithConfig(t.Context(), b.pool.Config())
	require.NoError(t, err)
	t.Cleanup(second.Close)
	b.engines[1] = idemflowtest.Engine(t, second, cfg, b.fee, b.interest)
	return b
}

// charge is one row of fee_charge.
type charge struct {
	operation, scope string
	slot             time.Time
	fee              int64
	operationID      uuid.UUID
}

func (b *bundle) charges(t *testing.T) []charge {
	t.Helper()
	rows, err := b.pool.Query(t.Context(), `SELECT operation, scope, slot, fee, operation_id FROM fee_charge ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var out []charge
	for rows.Next() {
		var c charge
		require.NoError(t, rows.Scan(&c.operation, &c.scope, &c.slot, &c.fee, &c.operationID))
		c.slot = c.slot.UTC()
		out = append(out, c)
	}
	require.NoError(t, rows.Err())
	return out
}

// finished waits for the operation of (scope, slot) of op to finish, and
// returns it.
func (b *bundle) finished(t *testing.T, op engine.Definition, scope string, slot time.Time) *engine.Info {
	t.Helper()
	e := b.engines[0]
	info, err := e.GetByKey(t.Context(), scope, schedule.Key(op.Name(), slot))
	require.NoError(t, err, "the operation of %s for %s", slot, scope)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	info, err = e.Wait(ctx, info.ID)
	require.NoError(t, err)
	return info
}

// operations counts the operations in the database, whatever their state.
func (b *bundle) operations(t *testing.T) int {
	t.Helper()
	n := 0
	for _, s := range []engine.Status{engine.StatusInProgress, engine.StatusSucceeded, engine.StatusFailed} {
		infos, err := b.engines[0].List(t.Context(), &engine.ListOpts{Status: s, Max: 10000})
		require.NoError(t, err)
		n += len(infos)
	}
	return n
}

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
	// changed is closed, and replaced, whenever a waiter is added.
	changed chan struct{}
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock(now time.Time) *fakeClock {
	return &fakeClock{now: now, changed: make(chan struct{})}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), ch: ch})
	close(c.changed)
	c.changed = make(chan struct{})
	return ch
}

// Advance moves the clock by d and wakes the waiters that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}

// BlockUntil returns once n waiters wait on the clock: its runner has done
// what it had to at this time and sleeps.
func (c *fakeClock) BlockUntil(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		c.mu.Lock()
		waiting, changed := len(c.waiters), c.changed
		c.mu.Unlock()
		if waiting >= n {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("fake clock: %d waiters, want %d: %v", waiting, n, ctx.Err())
		}
	}
}

// logRecorder keeps the messages of the records logged at Warn or above.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

// hourly is an hourly schedule of the fee, on the first engine, for every
// scope, logging to logger.
func (b *bundle) hourly(t *testing.T, logger *slog.Logger) *schedule.Runner[feeIn, feeState, feeOut] {
	t.Helper()
	r, err := schedule.New(b.engines[0], b.fee, &schedule.Config[feeIn]{
		Period:     time.Hour,
		ScopesFunc: func(context.Context, time.Time) ([]string, error) { return scopes, nil },
		InputFunc:  func(_ string, slot time.Time) feeIn { return feeFor(slot) },
		Logger:     logger,
	})
	require.NoError(t, err)
	return r
}
