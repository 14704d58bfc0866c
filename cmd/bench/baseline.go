package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/cmd/bench/internal/benchdb"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund"
)

// baseline is the yardstick: the refund written by hand, with no engine. It does
// the refund's database writes in two transactions, each sent as one pgx batch
// (one round trip; outside a transaction block the server runs a batch as one
// implicit transaction, all or nothing):
//
//  1. before the provider call: the key's reservation in bench_operation
//     (client-generated id, with the run's lease), then in one statement, as
//     the workflow's ledger step records it, the amount taken from what is left
//     to refund of the order, the pending refund and its ledger move (written
//     only if the reservation is this transaction's and the order has enough
//     left to refund);
//  2. after it: the refund marked succeeded, the answer stored in the
//     reservation, fenced by the run's id.
//
// No per-operation River job, no step checkpoints: a crash between the two
// transactions leaves a reservation whose lease expires, and a recovery would
// call the provider again with the same key (the refund row holds what it
// needs). It is what the engine's own work is measured against.
type baseline struct {
	pool     *pgxpool.Pool
	provider refund.Provider
	q        *benchdb.Queries
}

// refund runs one refund of amount of orderID under key.
func (b *baseline) refund(ctx context.Context, scope, key, orderID string, amount int64) error {
	in := refund.RefundInput{Client: scope, OrderID: orderID, Amount: amount}
	input, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("encode input: %w", err)
	}
	opID := pguuid.UUID(uuid.Must(uuid.NewV7()))
	runID := pguuid.UUID(uuid.New())
	refundID := refund.RefundIDPrefix + rand.Text()

	batch := &pgx.Batch{}
	bq := batchQueue{batch}
	_, _ = b.q.OperationReserve(ctx, bq, benchdb.OperationReserveParams{
		ID: opID, Scope: scope, Key: key, Input: input, RunID: &runID, Lease: 15 * time.Second, // the engine's default
	})
	_, _ = b.q.RefundRecordReserved(ctx, bq, benchdb.RefundRecordReservedParams{
		ID: refundID, Client: scope, OrderID: orderID, Amount: amount, OperationID: opID,
		MoveID: pguuid.UUID(uuid.Must(uuid.NewV7())), MerchantAccount: refund.MerchantAccount, CustomerAccountPrefix: refund.CustomerAccount(""),
	})
	tags, err := sendBatch(ctx, b.pool, batch)
	if err != nil {
		return fmt.Errorf("reserve and record the refund: %w", err)
	}
	switch {
	case tags[0].RowsAffected() != 1:
		return fmt.Errorf("key %s was taken", key)
	case tags[1].RowsAffected() != 1:
		// A real program would store the failure as the key's answer.
		return fmt.Errorf("order %s has no %d left to refund", orderID, amount)
	}

	// The provider's key: as unique per refund as the engine's derived key.
	ref, err := b.provider.Refund(ctx, "base_"+refundID, refund.ProviderRequest{
		OrderID: orderID, Amount: amount, Reference: refundID,
	})
	if err != nil {
		return fmt.Errorf("provider: %w", err)
	}
	result, err := json.Marshal(refund.Refund{
		RefundID: refundID, OrderID: orderID, Amount: amount, Status: refund.StatusSucceeded, ProviderRefundID: &ref.ID,
	})
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}

	batch = &pgx.Batch{}
	bq = batchQueue{batch}
	_, _ = b.q.RefundMarkSucceeded(ctx, bq, benchdb.RefundMarkSucceededParams{ID: refundID, ProviderRefundID: ref.ID})
	_, _ = b.q.OperationFinish(ctx, bq, benchdb.OperationFinishParams{ID: opID, RunID: &runID, RefundID: refundID, Result: result})
	if tags, err = sendBatch(ctx, b.pool, batch); err != nil {
		return fmt.Errorf("finish the refund: %w", err)
	}
	if tags[0].RowsAffected() != 1 || tags[1].RowsAffected() != 1 {
		return fmt.Errorf("refund %s: the finishing transaction found its rows changed", refundID)
	}
	return nil
}

// batchQueue is a benchdb.DBTX that queues the statements of sqlc's :exec and
// :execrows queries into a pgx batch instead of sending them; their command tags
// come back from sendBatch.
type batchQueue struct {
	b *pgx.Batch
}

var errBatchRead = errors.New("a batch queues statements; it cannot answer a read")

func (q batchQueue) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (q batchQueue) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errBatchRead
}

func (q batchQueue) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{}
}

type errRow struct{}

func (errRow) Scan(...any) error { return errBatchRead }

// sendBatch sends b in one round trip and returns the command tag of each of its
// statements.
func sendBatch(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch) ([]pgconn.CommandTag, error) {
	br := pool.SendBatch(ctx, b)
	tags := make([]pgconn.CommandTag, 0, b.Len())
	for range b.Len() {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		tags = append(tags, tag)
	}
	return tags, br.Close()
}
