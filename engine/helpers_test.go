package engine_test

import (
	"context"
	"fmt"
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
		engine.ExternalStep("payout", b.payout).Lookup(b.lookupPayout).Window(0),
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
		Faults:         engine.Faults{Hook: opts.hook},
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

// scratchDB returns the URL of a database of its own with the scratch tables,
// for a child process, and a pool on it, closed at cleanup.
func scratchDB(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := testdb.URL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, scratchSchema)
	require.NoError(t, err)
	return url, pool
}

// setupPool returns a database of its own with the scratch tables.
func setupPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), scratchSchema)
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

	res, err := e.River().Insert(ctx, fsResumeArgs{OperationID: id, Operation: before.Name}, &river.InsertOpts{Queue: defaultQueue})
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

// errOf is the error of a call that also returns the operation.
func errOf(_ *engine.Info, err error) error { return err }

// The engine's defaults, as its documentation states them.
const (
	defaultLease     = 15 * time.Second
	defaultQueue     = "idemflow"
	defaultRetention = 24 * time.Hour
	defaultRetryBase = time.Second
	defaultWindow    = 5 * time.Minute
	defaultActor     = "operator"
)
