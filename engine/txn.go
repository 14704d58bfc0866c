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
	// group, when not nil, may share the commit of a transaction that sent
	// nothing before it with others'.
	group *grouper
}

var _ Tx = (*txn)(nil)

func newTxn(pool *pgxpool.Pool, acquireTimeout time.Duration, group *grouper) *txn {
	return &txn{pool: pool, acquireTimeout: acquireTimeout, prelude: &pgx.Batch{}, group: group}
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
		return store.FailedRow(err)
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
