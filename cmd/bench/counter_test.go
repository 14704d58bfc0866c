package main

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// traced is one statement as pgx traces it: its SQL, and what it answered.
type traced struct {
	sql string
	tag string
	err error
}

// call is one call that pgx traces: a query (one statement) or a batch, sent on
// a connection whose transaction status was txStatus ('I' idle, 'T' in a
// transaction, 'E' in a failed one).
type call struct {
	txStatus byte
	batch    bool
	// stmts are the statements sent; of a batch, pgx traces those up to the
	// first that fails.
	stmts []traced
}

func query(txStatus byte, sql, tag string, err error) call {
	return call{txStatus: txStatus, stmts: []traced{{sql: sql, tag: tag, err: err}}}
}

func batch(txStatus byte, stmts ...traced) call {
	return call{txStatus: txStatus, batch: true, stmts: stmts}
}

// drive calls c's tracer methods as pgx would for each call.
func (c *counter) drive(calls []call) {
	ctx := context.Background()
	for _, cl := range calls {
		if !cl.batch {
			s := cl.stmts[0]
			qctx := c.queryStart(ctx, cl.txStatus, s.sql)
			c.TraceQueryEnd(qctx, nil, pgx.TraceQueryEndData{CommandTag: pgconn.NewCommandTag(s.tag), Err: s.err})
			continue
		}
		b := &pgx.Batch{}
		for _, s := range cl.stmts {
			b.Queue(s.sql)
		}
		bctx := c.batchStart(ctx, cl.txStatus, b)
		var err error
		for _, s := range cl.stmts {
			c.TraceBatchQuery(bctx, nil, pgx.TraceBatchQueryData{SQL: s.sql, CommandTag: pgconn.NewCommandTag(s.tag), Err: s.err})
			if err = s.err; err != nil {
				break
			}
		}
		c.TraceBatchEnd(bctx, nil, pgx.TraceBatchEndData{Err: err})
	}
}

func TestCounter(t *testing.T) {
	t.Parallel()
	errFailed := errors.New("ERROR: failed (SQLSTATE 23505)")
	const (
		reserve    = "-- name: OperationReserve :one\nINSERT INTO idemflow_operation (id) VALUES ($1)"
		record     = "-- name: RefundRecord :one\nWITH taken AS (UPDATE demo_order ...) SELECT customer_id FROM taken"
		checkpoint = "-- name: StepCheckpointMany :one\nWITH cp AS (INSERT INTO idemflow_step ...)"
	)
	ok := func(sql, tag string) traced { return traced{sql: sql, tag: tag} }
	failed := func(sql string) traced { return traced{sql: sql, err: errFailed} }

	for _, tc := range []struct {
		name       string
		calls      []call
		commits    int64
		rollbacks  int64
		roundTrips int64
		// statements counts all but BEGIN, COMMIT and ROLLBACK.
		statements int64
	}{
		{
			name:    "QueryOutsideATransaction",
			calls:   []call{query('I', record, "SELECT 1", nil)},
			commits: 1, roundTrips: 1, statements: 1,
		},
		{
			name:      "FailedQueryOutsideATransaction",
			calls:     []call{query('I', record, "", errFailed)},
			rollbacks: 1, roundTrips: 1, statements: 1,
		},
		{
			name: "QueriesInATransaction",
			calls: []call{
				query('I', "begin", "BEGIN", nil),
				query('T', record, "SELECT 1", nil),
				query('T', "commit", "COMMIT", nil),
			},
			commits: 1, roundTrips: 3, statements: 1,
		},
		{
			name: "CommitOfAFailedTransactionAnswersRollback",
			calls: []call{
				query('I', "begin", "BEGIN", nil),
				query('T', record, "", errFailed),
				query('E', "commit", "ROLLBACK", nil),
			},
			rollbacks: 1, roundTrips: 3, statements: 1,
		},
		{
			name: "RollbackQuery",
			calls: []call{
				query('I', "begin", "BEGIN", nil),
				query('T', record, "SELECT 1", nil),
				query('T', "rollback", "ROLLBACK", nil),
			},
			rollbacks: 1, roundTrips: 3, statements: 1,
		},
		{
			name:    "BatchOutsideATransactionIsOneImplicitTransaction",
			calls:   []call{batch('I', ok(reserve, "INSERT 0 1"), ok(record, "SELECT 1"))},
			commits: 1, roundTrips: 1, statements: 2,
		},
		{
			name:      "FailedBatchOutsideATransactionRollsBack",
			calls:     []call{batch('I', ok(reserve, "INSERT 0 1"), failed(record), ok(checkpoint, "SELECT 1"))},
			rollbacks: 1, roundTrips: 1, statements: 2,
		},
		{
			name: "BatchInATransaction",
			calls: []call{
				query('I', "begin", "BEGIN", nil),
				batch('T', ok(reserve, "INSERT 0 1"), ok(record, "SELECT 1")),
				query('T', "commit", "COMMIT", nil),
			},
			commits: 1, roundTrips: 3, statements: 2,
		},
		{
			// The engine's transaction: BEGIN and the reservation with the step's
			// statement, the checkpoint with COMMIT.
			name: "BatchThatBeginsThenBatchThatCommits",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(reserve, "INSERT 0 1"), ok(record, "SELECT 1")),
				batch('T', ok(checkpoint, "SELECT 1"), ok("commit", "COMMIT")),
			},
			commits: 1, roundTrips: 2, statements: 3,
		},
		{
			name: "BatchThatBeginsWithOptions",
			calls: []call{
				batch('I', ok("begin isolation level serializable", "BEGIN"), ok(record, "SELECT 1")),
				batch('T', ok("commit", "COMMIT")),
			},
			commits: 1, roundTrips: 2, statements: 1,
		},
		{
			name: "BatchThatBeginsAndCommits",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(record, "SELECT 1"), ok(checkpoint, "SELECT 1"), ok("commit", "COMMIT")),
			},
			commits: 1, roundTrips: 1, statements: 2,
		},
		{
			// The step's statement fails: the transaction is left open and failed,
			// and the engine rolls it back.
			name: "BatchThatBeginsFailsThenRollback",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(reserve, "INSERT 0 1"), failed(record)),
				query('E', "rollback", "ROLLBACK", nil),
			},
			rollbacks: 1, roundTrips: 2, statements: 2,
		},
		{
			// The checkpoint fails: the server skips COMMIT, pgx does not trace it,
			// and the engine rolls back.
			name: "CheckpointFailsBeforeCommitInABatch",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(record, "SELECT 1")),
				batch('T', failed(checkpoint), ok("commit", "COMMIT")),
				query('E', "rollback", "ROLLBACK", nil),
			},
			rollbacks: 1, roundTrips: 3, statements: 2,
		},
		{
			name: "CommitInABatchAnswersRollback",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(record, "SELECT 1")),
				batch('E', ok("commit", "ROLLBACK")),
			},
			rollbacks: 1, roundTrips: 2, statements: 1,
		},
		{
			name: "CommitInABatchFails",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(record, "SELECT 1")),
				batch('T', ok(checkpoint, "SELECT 1"), failed("COMMIT")),
			},
			rollbacks: 1, roundTrips: 2, statements: 2,
		},
		{
			name: "RollbackInABatch",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(record, "SELECT 1")),
				batch('T', ok("rollback", "ROLLBACK")),
			},
			rollbacks: 1, roundTrips: 2, statements: 1,
		},
		{
			name: "SeveralTransactions",
			calls: []call{
				batch('I', ok("begin", "BEGIN"), ok(reserve, "INSERT 0 1"), ok(record, "SELECT 1")),
				batch('T', ok(checkpoint, "SELECT 1"), ok("commit", "COMMIT")),
				batch('I', ok(reserve, "INSERT 0 1"), ok(record, "SELECT 1")),
				query('I', checkpoint, "SELECT 1", nil),
				batch('I', ok("begin", "BEGIN"), failed(record)),
				query('E', "rollback", "ROLLBACK", nil),
			},
			commits: 3, rollbacks: 1, roundTrips: 6, statements: 7,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &counter{}
			c.drive(tc.calls)
			got := c.snapshot()
			require.Equal(t, tc.commits, got.commits, "commits")
			require.Equal(t, tc.rollbacks, got.rollbacks, "rollbacks")
			require.Equal(t, tc.roundTrips, got.roundTrips, "round trips")
			require.Equal(t, tc.statements, got.statements(), "statements")
		})
	}
}
