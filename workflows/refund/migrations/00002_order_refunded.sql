-- What the order's pending and succeeded refunds take of its amount: the refund's
-- ledger step adds to it, in the statement that records the refund, and only
-- while it stays at most the amount; its compensation takes the refund back out.
-- It counts pending refunds too, so it is not the API's "refunded" (the sum of
-- the succeeded ones).
ALTER TABLE demo_order
    ADD COLUMN refunded bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT demo_order_refunded CHECK (refunded >= 0 AND refunded <= amount);

UPDATE demo_order AS o
SET refunded = r.refunded
FROM (
    SELECT client, order_id, sum(amount) AS refunded
    FROM demo_refund
    WHERE status IN ('pending', 'succeeded')
    GROUP BY client, order_id
) AS r
WHERE o.client = r.client AND o.order_id = r.order_id;

---- create above / drop below ----
ALTER TABLE demo_order DROP COLUMN refunded;
