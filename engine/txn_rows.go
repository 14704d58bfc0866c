package engine

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemflow/idemflow/store"
)

// stepResults are the results of the step's part of a batch that began the
// transaction. The transaction is the engine's: Tx is nil. Until they are
// closed, the step can send nothing else.
type stepResults struct {
	pgx.BatchResults
	t *txn
}

func (r *stepResults) Tx() pgx.Tx { return nil }

func (r *stepResults) Close() error {
	err := r.BatchResults.Close()
	r.t.release(r.BatchResults)
	return err
}

// batchRows are the rows of the one query of a batch; closing them closes the
// batch, which reads the rest of the server's answer.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

// batchRow is the row of the one query of a batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// stepError is the error of a statement that a step queued with AtCommit: the
// step's attempt failed, not the run.
type stepError struct {
	err error
}

func (e *stepError) Error() string { return e.err.Error() }

func (e *stepError) Unwrap() error { return e.err }

// atCommitTx is what AtCommit returns for the engine's transaction.
type atCommitTx struct {
	t *txn
}

var errAtCommitRead = errors.New("engine: a statement queued with AtCommit has no result for the step to read")

func (a atCommitTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	a.t.atCommit.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (a atCommitTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errAtCommitRead
}

func (a atCommitTx) QueryRow(context.Context, string, ...any) pgx.Row {
	return store.FailedRow(errAtCommitRead)
}

func (a atCommitTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, errAtCommitRead)
}

func (a atCommitTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errAtCommitRead
}
