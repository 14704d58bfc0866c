package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/store"
)

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
	if t.group != nil && t.conn == nil {
		return t.group.commit(ctx, &member{t: t, b: b, prelude: t.prelude.Len(), last: last})
	}
	return t.commitAlone(ctx, b, t.prelude.Len(), last)
}

// commitAlone sends b, the whole of an implicit transaction whose first
// prelude statements are the prelude's and whose last are last's, in a round
// trip of its own.
func (t *txn) commitAlone(ctx context.Context, b *pgx.Batch, prelude int, last *pgx.Batch) error {
	if t.conn == nil {
		if err := t.acquire(ctx); err != nil {
			return err
		}
	}
	t.firstSent = time.Now()
	br := t.conn.SendBatch(ctx, b)
	if err := t.readCommitted(br, prelude, last); err != nil {
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
		err := readStatement(br, last, i-prelude-n)
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

// readStatement reads the result of br's next statement, which is last's j-th
// when j >= 0: one of the engine's that reads its own result does so (its Fn).
func readStatement(br pgx.BatchResults, last *pgx.Batch, j int) error {
	if j >= 0 && last.QueuedQueries[j].Fn != nil {
		return last.QueuedQueries[j].Fn(br)
	}
	_, err := br.Exec()
	return err
}
