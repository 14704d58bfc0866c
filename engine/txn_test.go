package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/testdb"
	"github.com/idemflow/idemflow/store"
)

func txnPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE txn_test (n int PRIMARY KEY)`)
	require.NoError(t, err)
	return pool
}

func txnRows(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT n FROM txn_test ORDER BY n`)
	require.NoError(t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	return ns
}

// TestTxnStep drives the transaction a step gets through every method a step
// may call, first thing in the transaction (when the engine's BEGIN goes with
// it) and after.
func TestTxnStep(t *testing.T) {
	t.Parallel()
	insert := func(ctx context.Context, tx Tx, n int) error {
		_, err := tx.Exec(ctx, `INSERT INTO txn_test (n) VALUES ($1)`, n)
		return err
	}
	tests := []struct {
		name string
		step func(ctx context.Context, tx Tx) error
		want []int
	}{
		{"exec", func(ctx context.Context, tx Tx) error {
			if err := insert(ctx, tx, 1); err != nil {
				return err
			}
			return insert(ctx, tx, 2)
		}, []int{1, 2}},
		{"query", func(ctx context.Context, tx Tx) error {
			rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 3) AS g`)
			if err != nil {
				return err
			}
			ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
			if err != nil {
				return err
			}
			for _, n := range ns {
				if err := insert(ctx, tx, n*10); err != nil {
					return err
				}
			}
			return nil
		}, []int{10, 20, 30}},
		{"query left open", func(ctx context.Context, tx Tx) error {
			_, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 3) AS g`)
			return err
		}, []int{}},
		{"query row", func(ctx context.Context, tx Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT 7`).Scan(&n); err != nil {
				return err
			}
			return insert(ctx, tx, n)
		}, []int{7}},
		{"query row no rows", func(ctx context.Context, tx Tx) error {
			var n int
			err := tx.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(&n)
			if err != pgx.ErrNoRows {
				return err
			}
			return insert(ctx, tx, 8)
		}, []int{8}},
		{"batch", func(ctx context.Context, tx Tx) error {
			b := &pgx.Batch{}
			b.Queue(`INSERT INTO txn_test (n) VALUES (4)`)
			b.Queue(`INSERT INTO txn_test (n) VALUES (5)`)
			br := tx.SendBatch(ctx, b)
			if br.Tx() != nil {
				t.Error("a step's batch results hand out the engine's transaction")
			}
			return br.Close()
		}, []int{4, 5}},
		{"copy", func(ctx context.Context, tx Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{"txn_test"}, []string{"n"}, pgx.CopyFromRows([][]any{{11}, {12}}))
			return err
		}, []int{11, 12}},
		{"at commit", func(ctx context.Context, tx Tx) error {
			if _, err := AtCommit(tx).Exec(ctx, `INSERT INTO txn_test (n) VALUES (3)`); err != nil {
				return err
			}
			if _, err := AtCommit(tx).Query(ctx, `SELECT 1`); err == nil {
				t.Error("a read through AtCommit did not fail")
			}
			return insert(ctx, tx, 1)
		}, []int{1, 3}},
		{"nothing", func(context.Context, Tx) error { return nil }, []int{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := txnPool(t)
			tx := newTxn(pool, 0, nil)
			require.NoError(t, tc.step(ctx, tx))
			require.NoError(t, tx.commit(ctx, nil))
			require.Equal(t, tc.want, txnRows(t, pool))
			require.Zero(t, pool.Stat().AcquiredConns(), "the connection went back to the pool")
		})
	}

	t.Run("rolled back", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := txnPool(t)
		tx := newTxn(pool, 0, nil)
		require.NoError(t, insert(ctx, tx, 1))
		tx.end(ctx)
		tx.end(ctx)
		require.Empty(t, txnRows(t, pool))
		require.Zero(t, pool.Stat().AcquiredConns())
	})

	t.Run("failed statement", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := txnPool(t)
		tx := newTxn(pool, 0, nil)
		require.NoError(t, insert(ctx, tx, 1))
		require.Error(t, insert(ctx, tx, 1), "duplicate key")
		require.Error(t, tx.commit(ctx, nil), "a transaction with a failed statement commits nothing")
		require.Empty(t, txnRows(t, pool))
		require.Zero(t, pool.Stat().AcquiredConns())
	})
}

// reserve reserves key for a new operation on db and returns its parameters.
func reserve(t *testing.T, db store.DBTX, key string) store.OperationInsertParams {
	t.Helper()
	run := uuid.New()
	p := store.OperationInsertParams{
		ID: uuid.Must(uuid.NewV7()), Name: "op", Version: 1, Scope: "s", Key: key, Steps: []string{"a"},
		Input: json.RawMessage(`{}`), LockedBy: &run, Lease: time.Minute,
	}
	created, err := store.New().OperationInsert(context.Background(), db, p)
	require.NoError(t, err)
	require.True(t, created)
	return p
}

// TestTxnKeyTaken: when the reservation sent with a step's first statement
// finds the key taken, the step's statement does not run and nothing commits.
func TestTxnKeyTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := txnPool(t)
	p := reserve(t, pool, "k")

	tx := newTxn(pool, 0, nil)
	p.ID = uuid.Must(uuid.NewV7())
	require.NoError(t, store.New().OperationReserve(ctx, tx.queue(), p))
	_, err := tx.Exec(ctx, `INSERT INTO txn_test (n) VALUES (1)`)
	require.ErrorIs(t, err, store.ErrKeyTaken)
	require.ErrorIs(t, tx.failed, store.ErrKeyTaken)
	// Whatever the step sends next fails the same way, without a round trip.
	_, err = tx.Exec(ctx, `INSERT INTO txn_test (n) VALUES (2)`)
	require.ErrorIs(t, err, store.ErrKeyTaken)
	var n int
	require.ErrorIs(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&n), store.ErrKeyTaken)
	_, err = tx.Query(ctx, `SELECT 1`)
	require.ErrorIs(t, err, store.ErrKeyTaken)
	require.ErrorIs(t, tx.commit(ctx, nil), store.ErrKeyTaken)
	require.Empty(t, txnRows(t, pool))
	require.Zero(t, pool.Stat().AcquiredConns())
}

// TestTxnFenced: a checkpoint that another run got in first fails, and the
// COMMIT sent behind it in the same round trip commits nothing of the step's.
func TestTxnFenced(t *testing.T) {
	t.Parallel()
	st := store.New()
	checkpoint := func(p store.OperationInsertParams, finish bool, run uuid.UUID) store.StepCheckpointManyParams {
		return store.StepCheckpointManyParams{
			OperationID: p.ID,
			Steps:       []store.StepCheckpointParams{{Name: "a", Attempts: 1, Output: json.RawMessage(`{}`), StartedAt: time.Now()}},
			Finish:      finish, Run: run, State: store.OperationSucceeded, Result: json.RawMessage(`{}`),
		}
	}
	tests := []struct {
		name string
		// other is what another run did first; it returns this run's checkpoint.
		other func(t *testing.T, pool *pgxpool.Pool, p store.OperationInsertParams) store.StepCheckpointManyParams
	}{
		{"step recorded by another run", func(t *testing.T, pool *pgxpool.Pool, p store.OperationInsertParams) store.StepCheckpointManyParams {
			require.NoError(t, st.StepCheckpointMany(context.Background(), pool, checkpoint(p, false, *p.LockedBy)))
			return checkpoint(p, false, *p.LockedBy)
		}},
		{"retried step recorded by another run", func(t *testing.T, pool *pgxpool.Pool, p store.OperationInsertParams) store.StepCheckpointManyParams {
			require.NoError(t, st.StepRecordFailure(context.Background(), pool, store.StepRecordFailureParams{
				OperationID: p.ID, Name: "a", State: store.StepRetrying, Attempts: 1, LastError: "x", StartedAt: time.Now(),
			}))
			other := checkpoint(p, false, *p.LockedBy)
			other.Steps[0].Retried = true
			require.NoError(t, st.StepCheckpointMany(context.Background(), pool, other))
			return other
		}},
		{"step recorded by another run, at the end", func(t *testing.T, pool *pgxpool.Pool, p store.OperationInsertParams) store.StepCheckpointManyParams {
			require.NoError(t, st.StepCheckpointMany(context.Background(), pool, checkpoint(p, false, *p.LockedBy)))
			return checkpoint(p, true, *p.LockedBy)
		}},
		{"operation held by another run", func(t *testing.T, pool *pgxpool.Pool, p store.OperationInsertParams) store.StepCheckpointManyParams {
			return checkpoint(p, true, uuid.New())
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := txnPool(t)
			p := reserve(t, pool, "k")
			mine := tc.other(t, pool, p)

			tx := newTxn(pool, 0, nil)
			_, err := tx.Exec(ctx, `INSERT INTO txn_test (n) VALUES (1)`)
			require.NoError(t, err)
			last := &pgx.Batch{}
			require.NoError(t, st.StepCheckpointMany(ctx, store.Queue{Batch: last}, mine))
			require.ErrorIs(t, tx.commit(ctx, last), store.ErrFenced)
			require.Empty(t, txnRows(t, pool), "the step's write did not commit")
			require.Zero(t, pool.Stat().AcquiredConns())
		})
	}

	t.Run("held", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := txnPool(t)
		p := reserve(t, pool, "k")
		tx := newTxn(pool, 0, nil)
		_, err := tx.Exec(ctx, `INSERT INTO txn_test (n) VALUES (1)`)
		require.NoError(t, err)
		last := &pgx.Batch{}
		require.NoError(t, st.StepCheckpointMany(ctx, store.Queue{Batch: last}, checkpoint(p, true, *p.LockedBy)))
		require.NoError(t, tx.commit(ctx, last))
		require.Equal(t, []int{1}, txnRows(t, pool))
	})
}
