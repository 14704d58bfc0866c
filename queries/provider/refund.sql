-- name: RefundUpsert :one
-- Makes the refund asked for under an idempotency key, or, when the key has one
-- already, counts the request against it and answers that refund unchanged.
-- A refund made here (its first request) gets its webhook event in the same
-- statement, when event_id is not null: the event's body names the refund's
-- id, which is the one given here only on the first request.
WITH ref AS (
    INSERT INTO provider.refund (id, idempotency_key, order_id, amount, reference)
    VALUES (@id, @idempotency_key, @order_id, @amount, @reference)
    ON CONFLICT (idempotency_key) DO UPDATE
    SET requests = provider.refund.requests + 1
    RETURNING *
), event AS (
    INSERT INTO provider.webhook_event (id, refund_id, type, body)
    SELECT sqlc.narg(event_id)::text, ref.id, sqlc.arg(event_type)::text, sqlc.arg(event_body)::text
    FROM ref
    WHERE ref.requests = 1 AND sqlc.narg(event_id)::text IS NOT NULL
    RETURNING id
)
SELECT ref.id, ref.idempotency_key, ref.order_id, ref.amount, ref.reference, ref.requests, ref.created_at,
       (SELECT count(*) FROM event) > 0 AS event_made
FROM ref;

-- name: RefundGetByKey :one
SELECT * FROM provider.refund WHERE idempotency_key = @idempotency_key;

-- name: RefundList :many
SELECT * FROM provider.refund ORDER BY created_at, id;

-- name: RefundListPage :many
-- A page of the refunds, by id, after the id given ('' for the first page).
SELECT * FROM provider.refund WHERE id > @after ORDER BY id LIMIT @max;
