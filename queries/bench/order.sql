-- name: OrderInsertSeries :execrows
-- Records count orders of one client, prefix1 to prefixN, each of amount, paid
-- by customers cus_1 to cus_N.
INSERT INTO demo_order (client, order_id, customer_id, amount)
SELECT @client, sqlc.arg(prefix)::text || g, 'cus_' || g, @amount
FROM generate_series(1, sqlc.arg(count)::int) AS g;
