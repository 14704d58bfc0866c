package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/store"
)

// txn is one transaction of a run. It saves round trips by sending the engine's
// statements with the step's: nothing is sent when it is made; BEGIN and the
// statements queued in prelude (a first attempt's reservation) go out with the
// first thing the step sends, and the checkpoint goes out with COMMIT. When the
// step sent nothing itself (its writes, if any, went with AtCommit), all of it
// goes in one batch without BEGIN and COMMIT, which PostgreSQL runs as one
// implicit transaction. Every statement the engine queues fails rather than
// answer "no row" when it must not go on (store.ErrKeyTaken, store.ErrFenced),
// so that a COMMIT or a step's statement queued behind it never runs.
//
// A txn is a Tx for the step. It is not safe for concurrent use.
type txn struct {
	pool *pgxpool.Pool
	// acquireTimeout bounds the wait for a connection.
	acquireTimeout time.Duration
	// fenceAtCommit asks the run to fence the transaction with its COMMIT
	// rather than in its first batch.
	fenceAtCommit bool
	// firstSent is when the transaction's first batch was sent: what it
	// inserted then (a reservation) was stamped no earlier.
	firstSent time.Time
	// prelude is sent after BEGIN, before anything else.
	prelude *pgx.Batch
	conn    *pgxpool.Conn
	// tx is the transaction once BEGIN has been sent.
	tx pgx.Tx
	// failed is why the prelude failed, once it has.
	failed error
	// open is a batch whose results the step has not closed yet.
	open pgx.BatchResults
	// atCommit holds the step's statements queued with AtCommit.
	atCommit pgx.Batch
}

var _ Tx = (*txn)(nil)

func newTxn(pool *pgxpool.Pool, acquireTimeout time.Duration) *txn {
	return &txn{pool: pool, acquireTimeout: acquireTimeout, prelude: &pgx.Batch{}}
}

// acquire takes the transaction's connection from the pool, waiting at most
// acquireTimeout (when positive).
func (t *txn) acquire(ctx context.Context) error {
	if t.acquireTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.acquireTimeout)
		defer cancel()
	}
	conn, err := t.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("engine: acquire a connection: %w", err)
	}
	t.conn = conn
	return nil
}

// queue queues the engine's statements for the prelude: q is a store.Queue.
func (t *txn) queue() store.Queue {
	return store.Queue{Batch: t.prelude}
}

// send sends b, preceded by BEGIN and the prelude when the transaction has not
// begun, and returns b's results.
func (t *txn) send(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.usable(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	if t.tx != nil {
		return t.tx.SendBatch(ctx, b)
	}
	if t.conn == nil {
		if err := t.acquire(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	all := &pgx.Batch{}
	all.BeginTx(pgx.TxOptions{})
	t.firstSent = time.Now()
	all.QueuedQueries = append(all.QueuedQueries, t.prelude.QueuedQueries...)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	br := t.conn.SendBatch(ctx, all)
	t.tx = br.Tx()
	for range 1 + t.prelude.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			if sqlIn(preprocessed(err), b) {
				// pgx refused the step's statement before sending anything (an
				// argument it cannot encode, SQL the server cannot parse): the
				// step's error, and the transaction has not begun.
				t.tx = nil
				return pgx.FailedBatchResults(b, err)
			}
			t.failed = store.Err(err)
			return pgx.FailedBatchResults(b, t.failed)
		}
	}
	if b.Len() == 0 {
		return br
	}
	t.open = br
	return &stepResults{BatchResults: br, t: t}
}

// errOpen is what a step gets for a statement sent while the rows or batch
// results of its previous one are still open, as from pgx ("conn busy").
var errOpen = errors.New("engine: the rows or batch results of the step's previous statement are still open; close them first (conn busy)")

// usable returns why the step cannot send a statement now, if it cannot.
func (t *txn) usable() error {
	switch {
	case t.failed != nil:
		return t.failed
	case t.open != nil:
		return errOpen
	}
	return nil
}

// release forgets br as the step's open results, once the step closed them.
func (t *txn) release(br pgx.BatchResults) {
	if t.open == br {
		t.open = nil
	}
}

// preprocessed returns the SQL of the statement that pgx refused before sending
// a batch (nothing of the batch ran), and "" for any other error.
func preprocessed(err error) string {
	var pe pgx.ErrPreprocessingBatch
	if errors.As(err, &pe) {
		return pe.SQL()
	}
	return ""
}

// sqlIn reports whether sql is that of one of b's statements.
func sqlIn(sql string, b *pgx.Batch) bool {
	if sql == "" {
		return false
	}
	for _, q := range b.QueuedQueries {
		if q.SQL == sql {
			return true
		}
	}
	return false
}

// rejected reports whether the server answered err for a statement, which then
// did not run and aborted its transaction; any other error (a connection
// lost, a context ended) leaves unknown what the server did with the batch.
func rejected(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	severity := pgErr.SeverityUnlocalized
	if severity == "" {
		severity = pgErr.Severity
	}
	return severity != "FATAL" && severity != "PANIC" && !strings.HasPrefix(pgErr.Code, "08")
}

// begin sends BEGIN and the prelude, if they have not been sent.
func (t *txn) begin(ctx context.Context) error {
	t.closeOpen()
	if t.tx != nil || t.failed != nil {
		return t.failed
	}
	return t.send(ctx, &pgx.Batch{}).Close()
}

// pgx returns the transaction as a pgx.Tx, for the engine's rare paths that
// need one (River's InsertTx).
func (t *txn) pgx(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx, nil
}

// commit sends the statements queued with AtCommit, what is queued in last (the
// checkpoint), then COMMIT, in one round trip. It rolls back when any of it
// fails, and ends the transaction in every case. A failed AtCommit statement is
// a *stepError.
func (t *txn) commit(ctx context.Context, last *pgx.Batch) error {
	defer t.end(ctx)
	t.closeOpen()
	if t.failed != nil {
		return t.failed
	}
	if last == nil {
		last = &pgx.Batch{}
	}
	if t.tx == nil {
		return t.commitImplicit(ctx, last)
	}
	b := &pgx.Batch{}
	b.QueuedQueries = append(b.QueuedQueries, t.atCommit.QueuedQueries...)
	b.QueuedQueries = append(b.QueuedQueries, last.QueuedQueries...)
	b.Queue("commit")
	br := t.tx.SendBatch(ctx, b)
	if err := t.readCommitted(br, 0, last); err != nil {
		return err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return commitError(err)
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("engine: commit: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// commitImplicit commits a transaction that has sent nothing yet: the prelude,
// the AtCommit statements and last go in one batch with neither BEGIN nor
// COMMIT. PostgreSQL runs the statements of a pipeline up to its Sync as one
// implicit transaction, all or nothing (as pgx runs a batch outside a
// transaction block), which spares two statements.
func (t *txn) commitImplicit(ctx context.Context, last *pgx.Batch) error {
	b := &pgx.Batch{}
	b.QueuedQueries = append(b.QueuedQueries, t.prelude.QueuedQueries...)
	b.QueuedQueries = append(b.QueuedQueries, t.atCommit.QueuedQueries...)
	b.QueuedQueries = append(b.QueuedQueries, last.QueuedQueries...)
	if b.Len() == 0 {
		return nil // nothing to write
	}
	if t.conn == nil {
		if err := t.acquire(ctx); err != nil {
			return err
		}
	}
	t.firstSent = time.Now()
	br := t.conn.SendBatch(ctx, b)
	if err := t.readCommitted(br, t.prelude.Len(), last); err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return commitError(err)
	}
	return nil
}

// commitError is the error of a commit itself. The server refuses one only for
// a deferred constraint, which only a step's writes have: the step's failure,
// and nothing committed. Any other error leaves the outcome unknown: the run's.
func commitError(err error) error {
	if rejected(err) {
		return &stepError{err: err}
	}
	return fmt.Errorf("engine: commit: %w", err)
}

// readCommitted reads the results of prelude statements of the prelude, then
// of the AtCommit statements, then of last statements of last, and closes br
// at the first error: a failed prelude fails the transaction (t.failed), an
// AtCommit statement that the server refused (or pgx refused before sending)
// fails the step (*stepError). Any other error is the run's: the COMMIT may
// have run.
func (t *txn) readCommitted(br pgx.BatchResults, prelude int, last *pgx.Batch) error {
	n := t.atCommit.Len()
	for i := range prelude + n + last.Len() {
		var err error
		if j := i - prelude - n; j >= 0 && last.QueuedQueries[j].Fn != nil {
			// A statement of the engine's that reads its own result.
			err = last.QueuedQueries[j].Fn(br)
		} else {
			_, err = br.Exec()
		}
		if err == nil {
			continue
		}
		_ = br.Close()
		if sql := preprocessed(err); sql != "" {
			// Nothing of the batch ran; the error is the refused statement's.
			if sqlIn(sql, &t.atCommit) {
				return &stepError{err: err}
			}
			return err
		}
		switch {
		case i < prelude:
			t.failed = store.Err(err)
			return t.failed
		case i < prelude+n && rejected(err):
			return &stepError{err: err}
		}
		return store.Err(err)
	}
	return nil
}

// end rolls back what has not committed and gives the connection back. It is
// safe to call more than once.
func (t *txn) end(ctx context.Context) {
	t.closeOpen()
	if t.conn == nil {
		return
	}
	if t.conn.Conn().PgConn().TxStatus() != 'I' {
		// A failed ROLLBACK leaves the connection in a transaction, and Release
		// then closes it rather than give it to someone else.
		_, _ = t.conn.Exec(context.WithoutCancel(ctx), "rollback")
	}
	t.conn.Release()
	t.conn = nil
}

// closeOpen closes results that the step left open, which would otherwise keep
// the connection busy.
func (t *txn) closeOpen() {
	if t.open != nil {
		_ = t.open.Close()
		t.open = nil
	}
}

// Exec runs sql in the transaction.
func (t *txn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.usable(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if t.tx != nil {
		return t.tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.send(ctx, b)
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql in the transaction.
func (t *txn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.send(ctx, b)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return rows, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql in the transaction.
func (t *txn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.usable(); err != nil {
		return errRow{err}
	}
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.send(ctx, b)
	return batchRow{row: br.QueryRow(), br: br}
}

// SendBatch sends b in the transaction.
func (t *txn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.send(ctx, b)
}

// CopyFrom copies rows into the table in the transaction.
func (t *txn) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.usable(); err != nil {
		return 0, err
	}
	tx, err := t.pgx(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

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
	return errRow{errAtCommitRead}
}

func (a atCommitTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, errAtCommitRead)
}

func (a atCommitTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errAtCommitRead
}

// errRow is a row that fails with err.
type errRow struct {
	err error
}

func (r errRow) Scan(...any) error { return r.err }
