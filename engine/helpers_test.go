package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/internal/faults"
	"github.com/idemflow/idemflow/internal/testdb"
)

// The test operation moves money between two accounts of a scratch ledger, asks a
// provider that lives in the same database (so it survives a crashed process) to
// pay out, and records the payout id.

type transferIn struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

type transferState struct {
	LedgerID int64  `json:"ledgerId"`
	PayoutID string `json:"payoutId"`
}

type transferOut struct {
	LedgerID int64  `json:"ledgerId"`
	PayoutID string `json:"payoutId"`
}

const scratchSchema = `
CREATE TABLE test_ledger (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL, note text NOT NULL DEFAULT '');
CREATE TABLE test_payout (key text PRIMARY KEY, id text NOT NULL, amount bigint NOT NULL, requests int NOT NULL DEFAULT 1);
CREATE TABLE test_final (ledger_id bigint PRIMARY KEY, payout_id text NOT NULL);
`

// bundle is what setup hands a test besides the engine.
type bundle struct {
	pool *pgxpool.Pool
	// failPayout, while positive, makes that many payout calls fail transiently.
	failPayout atomic.Int32
	// lostPayout, while positive, makes that many payout calls record the payout
	// and then fail, as a lost response does.
	lostPayout atomic.Int32
	// declinePayout makes every payout call fail permanently.
	declinePayout atomic.Bool
	lookups       atomic.Int32
	calls         atomic.Int32
}

func ledger(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, s *transferState) error {
	if in.Amount <= 0 {
		return engine.Fail("invalid_amount", "amount must be positive")
	}
	if err := tx.QueryRow(ctx, `INSERT INTO test_ledger (account, amount) VALUES ($1, $2) RETURNING id`, in.From, -in.Amount).Scan(&s.LedgerID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO test_ledger (account, amount) VALUES ($1, $2)`, in.To, in.Amount)
	return err
}

func reverseLedger(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, s *transferState) error {
	_, err := tx.Exec(ctx, `INSERT INTO test_ledger (account, amount, note) VALUES ($1, $2, 'reversal'), ($3, $4, 'reversal')`,
		in.From, in.Amount, in.To, -in.Amount)
	return err
}

func finalize(ctx context.Context, tx engine.Tx, _ engine.Attempt, in transferIn, s *transferState) error {
	_, err := tx.Exec(ctx, `INSERT INTO test_final (ledger_id, payout_id) VALUES ($1, $2)`, s.LedgerID, s.PayoutID)
	return err
}

func (b *bundle) payout(ctx context.Context, call engine.Attempt, in transferIn, s *transferState) error {
	b.calls.Add(1)
	if b.declinePayout.Load() {
		return engine.Fail("declined", "the provider declined the payout")
	}
	if b.failPayout.Add(-1) >= 0 {
		return fmt.Errorf("provider unavailable")
	}
	err := b.pool.QueryRow(ctx, `INSERT INTO test_payout (key, id, amount) VALUES ($1, 'po_' || md5($1), $2)
		ON CONFLICT (key) DO UPDATE SET requests = test_payout.requests + 1 RETURNING id`, call.Key, in.Amount).Scan(&s.PayoutID)
	if err != nil {
		return err
	}
	if b.lostPayout.Add(-1) >= 0 {
		s.PayoutID = ""
		return fmt.Errorf("response lost")
	}
	return nil
}

func (b *bundle) lookupPayout(ctx context.Context, call engine.Attempt, in transferIn, s *transferState) (bool, error) {
	b.lookups.Add(1)
	err := b.pool.QueryRow(ctx, `SELECT id FROM test_payout WHERE key = $1`, call.Key).Scan(&s.PayoutID)
	if err == pgx.ErrNoRows {
		return false, nil
	}
	return err == nil, err
}

func (b *bundle) transferOp(t testing.TB, retry engine.RetryPolicy) *engine.Operation[transferIn, transferState, transferOut] {
	op, err := engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("ledger", ledger).Compensate(reverseLedger),
		engine.ExternalStep("payout", b.payout).Lookup(b.lookupPayout).Settle(0),
		engine.TxStep("finalize", finalize),
	}, func(in transferIn, s *transferState) (transferOut, error) {
		return transferOut(*s), nil
	}, &engine.OperationOpts{Retry: retry})
	require.NoError(t, err)
	return op
}

type setupOpts struct {
	retry   engine.RetryPolicy
	lease   time.Duration
	workers bool
	hook    faults.Hook
	// inlineRetry is Config.InlineRetryMax.
	inlineRetry time.Duration
}

// setup returns an engine on a database of its own with the scratch tables, the
// transfer operation registered, and River workers started when asked; its
// sweeps and polls are idemflowtest's, its lease 15 seconds unless asked.
func setup(t *testing.T, opts setupOpts) (*engine.Engine, *engine.Operation[transferIn, transferState, transferOut], *bundle) {
	t.Helper()
	ctx := context.Background()
	b := &bundle{pool: testdb.Pool(t)}
	_, err := b.pool.Exec(ctx, scratchSchema)
	require.NoError(t, err)
	if opts.retry.Base == 0 {
		opts.retry.Base = 10 * time.Millisecond
	}
	op := b.transferOp(t, opts.retry)
	if opts.lease == 0 {
		opts.lease = 15 * time.Second
	}
	cfg := &engine.Config{
		Lease:          opts.lease,
		Test:           faults.Config{Hook: opts.hook},
		InlineRetryMax: opts.inlineRetry,
	}
	if opts.workers {
		return idemflowtest.Engine(t, b.pool, cfg, op), op, b
	}
	return idemflowtest.NewEngine(t, b.pool, cfg, op), op, b
}

// books reads what the scratch tables hold.
type books struct {
	ledgerRows  int
	reversals   int
	payouts     int
	payoutCalls int // requests recorded by the provider, over all keys
	finals      int
}

func readBooks(t testing.TB, pool *pgxpool.Pool) books {
	t.Helper()
	var b books
	ctx := context.Background()
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE note = ''), count(*) FILTER (WHERE note = 'reversal') FROM test_ledger`).Scan(&b.ledgerRows, &b.reversals))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(requests), 0) FROM test_payout`).Scan(&b.payouts, &b.payoutCalls))
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM test_final`).Scan(&b.finals))
	return b
}

func waitDone(t testing.TB, e *engine.Engine, s *engine.Started) *engine.Info {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := s.Wait(ctx)
	require.NoError(t, err)
	return info
}

// setupPool returns a database of its own with the scratch tables.
func setupPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), scratchSchema)
	require.NoError(t, err)
	return pool
}
