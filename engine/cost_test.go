package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/internal/testdb"
)

// statementCounter is a pgx tracer (queries and batches) that tells the
// engine's statements (sqlc queries start with "-- name:") from the steps' own,
// and counts commits (a COMMIT, or a batch that ran as an implicit transaction)
// and round trips (a batch is one).
type statementCounter struct {
	mu         sync.Mutex
	engine     []string
	steps      int
	commits    int
	begins     int
	roundTrips int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roundTrips++
	c.statement(data.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type implicitKey struct{}

func (c *statementCounter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roundTrips++
	// Outside a transaction block, a batch that does not begin one is a
	// transaction of its own, which commits when the whole batch succeeds.
	qs := data.Batch.QueuedQueries
	implicit := conn.PgConn().TxStatus() == 'I' && len(qs) > 0 && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(qs[0].SQL)), "begin")
	return context.WithValue(ctx, implicitKey{}, implicit)
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.statement(data.SQL)
}

func (c *statementCounter) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if implicit, _ := ctx.Value(implicitKey{}).(bool); implicit && data.Err == nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.commits++
	}
}

// statement counts one statement; c.mu is held.
func (c *statementCounter) statement(sql string) {
	sql = strings.TrimSpace(sql)
	switch {
	case strings.EqualFold(sql, "begin"):
		c.begins++
	case strings.EqualFold(sql, "commit"):
		c.commits++
	case strings.HasPrefix(sql, "-- name: "):
		c.engine = append(c.engine, strings.Fields(sql)[2])
	default:
		c.steps++
	}
}

func (c *statementCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.engine, c.steps, c.commits, c.begins, c.roundTrips = nil, 0, 0, 0, 0
}

// countedPool returns a pool on a database of its own, with schema applied and
// a statementCounter tracing it.
func countedPool(t *testing.T, schema string) (*pgxpool.Pool, *statementCounter) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	require.NoError(t, err)
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, schema)
	require.NoError(t, err)
	return pool, counter
}

// TestFirstAttemptCost pins what a first attempt of a tx, external, tx operation
// costs the database: two commits (one before the call, one after), three
// statements of the engine's own, and no round trip of its own: BEGIN and the
// reservation go with a step's first statement, each checkpoint with COMMIT.
// The figures are counts, not timings.
func TestFirstAttemptCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, counter := countedPool(t, scratchSchema)

	// The payout records nothing in this database, so that only the engine's and
	// the tx steps' statements are counted.
	op, err := engine.NewOperation("transfer", []engine.Step[transferIn, transferState]{
		engine.TxStep("ledger", ledger),
		engine.ExternalStep("payout", func(ctx context.Context, call engine.Attempt, in transferIn, s *transferState) error {
			s.PayoutID = "po_" + call.Key
			return nil
		}),
		engine.TxStep("finalize", finalize),
	}, func(in transferIn, s *transferState) (transferOut, error) { return transferOut(*s), nil }, nil)
	require.NoError(t, err)
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(context.Background()) })

	for i := range 3 {
		counter.reset()
		started, err := engine.Start(ctx, e, op, "c", fmt.Sprint("k", i), transferIn{From: "a", To: "b", Amount: 1}, nil)
		require.NoError(t, err)
		info := waitDone(t, e, started)
		require.Equal(t, engine.StatusSucceeded, info.Status)

		counter.mu.Lock()
		require.Equal(t, 2, counter.commits)
		// The reservation; the ledger checkpoint (the ledger step sends its own
		// statements, so the reservation has gone before it succeeded); the
		// payout and finalize checkpoints with the stored result.
		require.Equal(t, []string{"OperationReserve", "OperationCheckpoint", "OperationFinish"}, counter.engine)
		require.Equal(t, 3, counter.steps, "the steps' own statements")
		// One per step statement (the ledger sends 2, finalize 1) and one per
		// commit; the first attempt's connections are warm after the first run.
		if i > 0 {
			require.Equal(t, 5, counter.roundTrips)
		}
		t.Logf("commits=%d engine statements=%d %v step statements=%d round trips=%d",
			counter.commits, len(counter.engine), counter.engine, counter.steps, counter.roundTrips)
		counter.mu.Unlock()
	}

	// A replay sends the reservation, which finds the key taken, and reads the
	// stored answer: two statements and nothing written.
	counter.reset()
	replay, err := engine.Start(ctx, e, op, "c", "k0", transferIn{From: "a", To: "b", Amount: 1}, nil)
	require.NoError(t, err)
	require.False(t, replay.Created)
	counter.mu.Lock()
	require.Equal(t, []string{"OperationReserve", "OperationGetByKey"}, counter.engine)
	require.Zero(t, counter.commits)
	counter.mu.Unlock()
}
