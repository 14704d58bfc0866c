-- name: RefundUpsert :one
-- Makes the refund asked for under an idempotency key, or, when the key has one
-- already, counts the request against it and answers that refund unchanged.
INSERT INTO provider.refund (id, idempotency_key, order_id, amount, reference)
VALUES (@id, @idempotency_key, @order_id, @amount, @reference)
ON CONFLICT (idempotency_key) DO UPDATE
SET requests = provider.refund.requests + 1
RETURNING *;

-- name: RefundGetByKey :one
SELECT * FROM provider.refund WHERE idempotency_key = @idempotency_key;

-- name: RefundList :many
SELECT * FROM provider.refund ORDER BY created_at, id;

-- name: RefundListPage :many
-- A page of the refunds, by id, after the id given ('' for the first page).
SELECT * FROM provider.refund WHERE id > @after ORDER BY id LIMIT @max;
