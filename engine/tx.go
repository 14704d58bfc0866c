package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is the transaction that a transactional step, or a compensation, writes
// through. The engine begins it and ends it: the step's writes commit with its
// checkpoint or not at all, so a step has no way to commit or roll back itself.
// A pgx.Tx is a Tx, which lets a step be tested on its own; sqlc's generated
// queries take one as their DBTX.
//
// The engine sends what a Tx is asked for together with its own statements
// where it can (the reservation and BEGIN with a step's first statement, the
// checkpoint with COMMIT), so a step that sends one batch, or one statement,
// costs one round trip. Send several statements in one pgx.Batch (SendBatch) to
// keep it so.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

var _ Tx = pgx.Tx(nil)

// AtCommit returns a Tx whose Exec does not send its statement but queues it to
// run when the engine commits the step's transaction, after the step has
// returned, in the round trip of the checkpoint and COMMIT: a step whose writes
// all go this way costs no round trip of its own. The step never sees the
// statement's result, so use it only for a write that fails on its own (a
// constraint, an error raised in SQL) when the step must not succeed: the
// transaction then commits nothing, and the attempt fails with that error as
// if the step had returned it (a transient failure, retried). Reads, batches
// and copies through the returned Tx fail.
//
// A transaction whose step sent nothing itself, its writes all queued so, may
// also share its commit with other operations' that are ready at the same
// moment (Config.GroupCommit): under load, many operations then cost one round
// trip and one commit. Its statements and their failures are its own all the
// same; a transaction whose statements change its settings (SET, set_config)
// never shares its commit, and statements that rely on the transaction's
// identity or time (txid_current(), now()) belong in a Tx of their own, not
// queued with AtCommit.
//
// On a Tx that is not the engine's, a pgx.Tx in a test for instance, AtCommit
// returns tx itself: the statement runs at once.
func AtCommit(tx Tx) Tx {
	if t, ok := tx.(*txn); ok {
		return atCommitTx{t}
	}
	return tx
}

// PgxTx returns the step's transaction as a pgx.Tx, for a library that takes one
// (River's InsertTx, to enqueue a job that commits with the step's writes and
// checkpoint, or not at all). Its Commit and Rollback return an error.
//
// It costs the step its deferred BEGIN: BEGIN, and on a first attempt the key's
// reservation, are sent at once in a round trip of their own rather than with
// the step's first statement. Statements sent through the pgx.Tx go out one by
// one; close the rows of one before sending the next, as with any pgx.Tx. On a
// Tx that is already a pgx.Tx (a step's own test) it returns it; on the Tx of
// AtCommit it fails.
func PgxTx(ctx context.Context, tx Tx) (pgx.Tx, error) {
	switch t := tx.(type) {
	case *txn:
		if err := t.usable(); err != nil {
			return nil, err
		}
		ptx, err := t.pgx(ctx)
		if err != nil {
			return nil, err
		}
		return ownedTx{ptx}, nil
	case pgx.Tx:
		return t, nil
	case atCommitTx:
		return nil, errors.New("engine: PgxTx: the Tx of AtCommit runs statements at commit only")
	}
	return nil, fmt.Errorf("engine: PgxTx: %T is neither the engine's Tx nor a pgx.Tx", tx)
}

// ownedTx is a step's transaction as a pgx.Tx that the step cannot end.
type ownedTx struct{ pgx.Tx }

func (ownedTx) Commit(context.Context) error   { return errOwnedTx }
func (ownedTx) Rollback(context.Context) error { return errOwnedTx }
