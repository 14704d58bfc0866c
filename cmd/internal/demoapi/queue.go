package demoapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/google/uuid"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idempotency"
	"github.com/idemflow/idemflow/workflows/refund"
)

// maxQueueBody bounds the body of POST /queue/orders, as idempotency bounds
// the keyed requests'.
const maxQueueBody = idempotency.DefaultMaxBodyBytes

// The statuses of GET /queue/orders/{messageId}.
const (
	messagePending  = "pending"
	messageDone     = "done"
	messageRejected = "rejected"
)

// queueMessageBody is the answer of GET /queue/orders/{messageId}.
type queueMessageBody struct {
	MessageID string `json:"messageId"`
	// Status is pending (not consumed, or its order operation still runs),
	// done (the operation finished) or rejected.
	Status      string     `json:"status"`
	Deliveries  int        `json:"deliveries"`
	OperationID *uuid.UUID `json:"operationId"`
	// Error is why the message was rejected, or why its operation failed.
	Error *string `json:"error"`
}

// enqueueOrder serves POST /queue/orders: it records the message and enqueues
// it, with the configured duplicates, and answers 202 once that committed.
// There is no Idempotency-Key: the message id is the consumer's key.
func (s *server) enqueueOrder(w http.ResponseWriter, r *http.Request) {
	client := clientOf(r)
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxQueueBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		w.Header().Set("Connection", "close")
		idempotency.WriteError(w, http.StatusRequestEntityTooLarge, idempotency.CodeRequestTooLarge,
			fmt.Sprintf("the request body is larger than %d bytes", maxQueueBody), nil)
		return
	}
	if err != nil {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, "the request body could not be read", nil)
		return
	}
	msg, err := decodeQueueOrder(client, data)
	if fe := (*idempotency.FieldError)(nil); errors.As(err, &fe) {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, fe.Error(), map[string]any{"param": fe.Param})
		return
	}
	if err != nil {
		idempotency.WriteError(w, http.StatusBadRequest, idempotency.CodeInvalidRequest, err.Error(), nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := refund.EnqueueOrder(ctx, tx, s.cfg.EntryPoints.Queue, msg, 1+s.cfg.EntryPoints.QueueDuplicates); err != nil {
		s.internalError(w, r, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"messageId": msg.MessageID})
}

// decodeQueueOrder reads the body of POST /queue/orders.
func decodeQueueOrder(client string, data []byte) (refund.QueueOrderArgs, error) {
	msg := refund.QueueOrderArgs{Client: client}
	var f idempotency.Fields
	if err := json.Unmarshal(data, &f); err != nil || f == nil {
		return msg, errors.New("the request body must be a JSON object")
	}
	if err := f.Only("messageId", "orderId", "customerId", "amount"); err != nil {
		return msg, err
	}
	for _, field := range []struct {
		name string
		dst  *string
	}{{"messageId", &msg.MessageID}, {"orderId", &msg.OrderID}, {"customerId", &msg.CustomerID}} {
		if err := requiredID(f, field.name, field.dst); err != nil {
			return msg, err
		}
	}
	return msg, positiveAmount(f, &msg.Amount)
}

// getQueueMessage serves GET /queue/orders/{messageId}.
func (s *server) getQueueMessage(w http.ResponseWriter, r *http.Request) {
	notFound := func() {
		idempotency.WriteError(w, http.StatusNotFound, "message_not_found", "no such message", nil)
	}
	id := r.PathValue("messageId")
	if !possibleID(id) {
		notFound()
		return
	}
	m, err := refund.GetQueueMessage(r.Context(), s.cfg.Pool, clientOf(r), id)
	if errors.Is(err, refund.ErrMessageNotFound) {
		notFound()
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	body := queueMessageBody{MessageID: m.MessageID, Status: messagePending, Deliveries: m.Deliveries, OperationID: m.OperationID, Error: m.Error}
	switch m.Status {
	case refund.MessageRejected:
		body.Status = messageRejected
	case refund.MessageConsumed:
		info, err := s.cfg.Engine.Get(r.Context(), *m.OperationID)
		if err != nil && !errors.Is(err, engine.ErrNotFound) {
			s.internalError(w, r, err)
			return
		}
		switch {
		case err != nil:
			// The retention deleted the finished operation.
			body.Status = messageDone
		case info.Status == engine.StatusSucceeded:
			body.Status = messageDone
		case info.Status == engine.StatusFailed:
			body.Status = messageDone
			if info.Error != nil {
				body.Error = &info.Error.Message
			}
		}
	}
	if body.OperationID != nil {
		w.Header().Set(idempotency.HeaderOperationID, body.OperationID.String())
	}
	writeJSON(w, http.StatusOK, body)
}
