-- name: RefundInsert :exec
INSERT INTO demo_refund (id, client, order_id, amount)
VALUES (@id, @client, @order_id, @amount);

-- name: RefundSumCommitted :one
-- The amount of an order that its pending and succeeded refunds take.
SELECT coalesce(sum(amount), 0)::bigint AS committed
FROM demo_refund
WHERE client = @client AND order_id = @order_id AND status IN ('pending', 'succeeded');

-- name: RefundMarkSucceeded :execrows
UPDATE demo_refund
SET status = 'succeeded', provider_refund_id = sqlc.arg(provider_refund_id)::text, updated_at = clock_timestamp()
WHERE id = @id AND status = 'pending';

-- name: RefundMarkFailed :execrows
UPDATE demo_refund
SET status = 'failed', updated_at = clock_timestamp()
WHERE id = @id AND status = 'pending';

-- name: RefundGet :one
SELECT * FROM demo_refund WHERE client = @client AND id = @id;

-- name: RefundListByOrder :many
SELECT * FROM demo_refund
WHERE client = @client AND order_id = @order_id
ORDER BY created_at, id;
