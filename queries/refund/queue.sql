-- name: QueueMessageReceive :exec
-- Records a message the queue received, once per (client, message id): a
-- message sent again, with the same body or another, keeps its row.
INSERT INTO demo_queue_message (client, message_id)
VALUES (@client, @message_id)
ON CONFLICT (client, message_id) DO NOTHING;

-- name: QueueMessageConsumed :exec
-- Counts a delivery that started the message's order operation, or found the
-- one an earlier delivery started. A message that was rejected stays so.
UPDATE demo_queue_message
SET deliveries = deliveries + 1,
    operation_id = sqlc.arg(operation_id)::uuid,
    status = CASE WHEN status = 'rejected' THEN status ELSE 'consumed' END,
    updated_at = clock_timestamp()
WHERE client = @client AND message_id = @message_id;

-- name: QueueMessageRejected :exec
-- Counts a delivery whose body differs from the one the message id's operation
-- was started with, and marks the message rejected, saying why.
UPDATE demo_queue_message
SET deliveries = deliveries + 1,
    operation_id = coalesce(sqlc.narg(operation_id), operation_id),
    status = 'rejected',
    error = sqlc.arg(error)::text,
    updated_at = clock_timestamp()
WHERE client = @client AND message_id = @message_id;

-- name: QueueMessageGet :one
SELECT * FROM demo_queue_message WHERE client = @client AND message_id = @message_id;
