package refund

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/entry/riverjob"
	"github.com/idemflow/idemflow/internal/pguuid"
	"github.com/idemflow/idemflow/workflows/refund/internal/refunddb"
)

// OrderQueue is the River queue of the queued orders.
const OrderQueue = "demo_orders"

// ErrMessageNotFound is returned by GetQueueMessage when the client sent no
// message of that id.
var ErrMessageNotFound = errors.New("refund: queued message not found")

// QueueOrderArgs is an order that a client sent as a queued message, as a
// River job: the message's id and body. Every delivery of the message is a job
// with the same args.
type QueueOrderArgs struct {
	Client     string `json:"client"`
	MessageID  string `json:"messageId"`
	OrderID    string `json:"orderId"`
	CustomerID string `json:"customerId"`
	Amount     int64  `json:"amount"`
}

// Kind implements river.JobArgs.
func (QueueOrderArgs) Kind() string { return "demo_queue_order" }

// InsertOpts puts the jobs on OrderQueue.
func (QueueOrderArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: OrderQueue} }

// QueueScope is the engine scope of a client's message ids: apart from the
// client's own idempotency keys (its scope is its name), since a message id and
// a key may be the same string.
func QueueScope(client string) string { return "queue:" + client }

// EnqueueOrder records the message msg as received and inserts its job, copies
// times (the message and copies-1 duplicates, which the queue delivers at
// once), in tx with rc: all of it commits with tx, or none.
func EnqueueOrder(ctx context.Context, tx pgx.Tx, rc *river.Client[pgx.Tx], msg QueueOrderArgs, copies int) error {
	if err := refunddb.New().QueueMessageReceive(ctx, tx, refunddb.QueueMessageReceiveParams{Client: msg.Client, MessageID: msg.MessageID}); err != nil {
		return fmt.Errorf("refund: record the queued message: %w", err)
	}
	jobs := make([]river.InsertManyParams, max(copies, 1))
	for i := range jobs {
		jobs[i] = river.InsertManyParams{Args: msg}
	}
	if _, err := rc.InsertManyTx(ctx, tx, jobs); err != nil {
		return fmt.Errorf("refund: enqueue the message: %w", err)
	}
	return nil
}

// OrderConsumer returns the configuration of the entry/riverjob worker that
// consumes the queued orders: each message starts the order operation under
// its id in the client's QueueScope, once, and every delivery counts itself in
// the message's record (GetQueueMessage), in the job's transaction.
func (w *Workflows) OrderConsumer() *riverjob.Config[QueueOrderArgs, OrderInput] {
	return &riverjob.Config[QueueOrderArgs, OrderInput]{
		MessageFunc: func(job *river.Job[QueueOrderArgs]) (riverjob.Message[OrderInput], error) {
			a := job.Args
			return riverjob.Message[OrderInput]{
				Scope: QueueScope(a.Client),
				ID:    a.MessageID,
				Input: OrderInput{Client: a.Client, OrderID: a.OrderID, CustomerID: a.CustomerID, Amount: a.Amount},
			}, nil
		},
		StartedFunc: func(ctx context.Context, tx pgx.Tx, job *river.Job[QueueOrderArgs], started *engine.Started) error {
			err := w.q.QueueMessageConsumed(ctx, tx, refunddb.QueueMessageConsumedParams{
				OperationID: pguuid.UUID(started.ID), Client: job.Args.Client, MessageID: job.Args.MessageID,
			})
			if err != nil {
				return fmt.Errorf("count the delivery of message %s: %w", job.Args.MessageID, err)
			}
			return nil
		},
		RejectedFunc: func(ctx context.Context, tx pgx.Tx, job *river.Job[QueueOrderArgs], reason error) error {
			p := refunddb.QueueMessageRejectedParams{
				Error: "the message id is empty", Client: job.Args.Client, MessageID: job.Args.MessageID,
			}
			if kr := (*engine.ReusedError)(nil); errors.As(reason, &kr) {
				id := pguuid.UUID(kr.Operation)
				p.OperationID = &id
				p.Error = fmt.Sprintf("the message id was used before with another body; fields that differ: %s", strings.Join(kr.Fields, ", "))
			}
			if err := w.q.QueueMessageRejected(ctx, tx, p); err != nil {
				return fmt.Errorf("record the rejection of message %s: %w", job.Args.MessageID, err)
			}
			return nil
		},
	}
}

// The states of a queued message's record.
const (
	// MessagePending: received; no delivery has reached the consumer yet.
	MessagePending = "pending"
	// MessageConsumed: a delivery started the message's order operation.
	MessageConsumed = "consumed"
	// MessageRejected: a delivery's body differs from the one the message id's
	// operation was started with.
	MessageRejected = "rejected"
)

// QueueMessage is the record of a queued message.
type QueueMessage struct {
	MessageID string
	// Status is MessagePending, MessageConsumed or MessageRejected.
	Status string
	// Deliveries counts the deliveries the consumer took: consumed or rejected.
	Deliveries int
	// OperationID is the order operation that holds the message id, once a
	// delivery found it.
	OperationID *uuid.UUID
	// Error says why a delivery was rejected.
	Error *string
}

// GetQueueMessage reads the record of the client's message messageID. It
// returns ErrMessageNotFound when the client sent none.
func GetQueueMessage(ctx context.Context, db DBTX, client, messageID string) (*QueueMessage, error) {
	row, err := refunddb.New().QueueMessageGet(ctx, db, refunddb.QueueMessageGetParams{Client: client, MessageID: messageID})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrMessageNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("refund: get queued message: %w", err)
	}
	m := &QueueMessage{MessageID: row.MessageID, Status: row.Status, Deliveries: int(row.Deliveries), Error: row.Error}
	if row.OperationID != nil {
		id := uuid.UUID(*row.OperationID)
		m.OperationID = &id
	}
	return m, nil
}
