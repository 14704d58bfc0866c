-- name: RefundInsertChecked :execrows
-- Records a pending refund when the baseline's reservation committed in this
-- transaction (operation_id) and the order has amount left to refund. Run it
-- after OrderLock, in its own statement, so that its snapshot sees every refund
-- that committed before the lock was granted. Zero rows: no such order, the
-- amount exceeds what is left, or the key was taken.
INSERT INTO demo_refund (id, client, order_id, amount)
SELECT @id, o.client, o.order_id, sqlc.arg(amount)::bigint
FROM demo_order AS o
WHERE o.client = @client
  AND o.order_id = @order_id
  AND EXISTS (SELECT 1 FROM bench_operation AS op WHERE op.id = sqlc.arg(operation_id)::uuid)
  AND sqlc.arg(amount)::bigint <= o.amount - (
        SELECT coalesce(sum(r.amount), 0)
        FROM demo_refund AS r
        WHERE r.client = @client AND r.order_id = @order_id AND r.status IN ('pending', 'succeeded'));

-- name: RefundMarkSucceeded :execrows
UPDATE demo_refund
SET status = 'succeeded', provider_refund_id = sqlc.arg(provider_refund_id)::text, updated_at = clock_timestamp()
WHERE id = @id AND status = 'pending';
