-- name: OrderInsertSeries :execrows
-- Records count orders of one client, prefix1 to prefixN, each of amount, paid
-- by customers cus_1 to cus_N.
INSERT INTO demo_order (client, order_id, customer_id, amount)
SELECT @client, sqlc.arg(prefix)::text || g, 'cus_' || g, @amount
FROM generate_series(1, sqlc.arg(count)::int) AS g;

-- name: OrderLock :exec
-- Locks an order until the transaction ends, so that two refunds of it check
-- what is left to refund one after the other.
SELECT 1 FROM demo_order WHERE client = @client AND order_id = @order_id FOR UPDATE;
