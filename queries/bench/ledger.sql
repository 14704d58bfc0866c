-- name: LedgerMoveOrderSeries :execrows
-- The ledger moves of the orders that OrderInsertSeries recorded: each order's
-- amount from its customer to the merchant.
INSERT INTO demo_ledger_entry (client, move_id, account, amount, kind, order_id)
SELECT o.client, m.move_id,
       CASE WHEN s.sign < 0 THEN 'customer:' || o.customer_id ELSE 'merchant' END,
       s.sign * o.amount, 'order', o.order_id
FROM demo_order AS o
CROSS JOIN LATERAL (SELECT gen_random_uuid() AS move_id, o.order_id AS order_id) AS m
CROSS JOIN (SELECT unnest(ARRAY[-1, 1]) AS sign) AS s
WHERE o.client = @client AND o.order_id LIKE sqlc.arg(prefix)::text || '%';
