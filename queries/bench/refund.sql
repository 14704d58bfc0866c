-- name: RefundRecordReserved :execrows
-- The baseline's copy of the refund workflow's RefundRecord (queries/refund):
-- the same writes in one statement, and one more condition, that the baseline's
-- reservation (operation_id) was inserted in this transaction, so that a taken
-- key records nothing. The UPDATE takes amount from what is left to refund of
-- the order, only if it is left (after waiting for a concurrent refund's row
-- lock, it checks its WHERE again on the newest row); from the order it took,
-- the statement inserts the pending refund and moves amount from the merchant
-- to the order's customer, two entries that sum to zero. Its command tag counts
-- the rows of its final SELECT: 1 when it recorded the refund, 0 when the key
-- was taken, there is no such order, or less than amount is left to refund.
WITH taken AS (
    UPDATE demo_order AS o
    SET refunded = o.refunded + sqlc.arg(amount)::bigint
    WHERE o.client = @client AND o.order_id = @order_id
      AND sqlc.arg(amount)::bigint <= o.amount - o.refunded
      AND EXISTS (SELECT 1 FROM bench_operation AS op WHERE op.id = sqlc.arg(operation_id)::uuid)
    RETURNING o.client, o.order_id, o.customer_id
), refund AS (
    INSERT INTO demo_refund (id, client, order_id, amount)
    SELECT sqlc.arg(id)::text, t.client, t.order_id, sqlc.arg(amount)::bigint
    FROM taken AS t
    RETURNING id, client, order_id, amount
), entries AS (
    INSERT INTO demo_ledger_entry (client, move_id, account, amount, kind, order_id, refund_id)
    SELECT r.client, @move_id, e.account, e.amount, 'refund', r.order_id, r.id
    FROM refund AS r
    CROSS JOIN taken AS t
    CROSS JOIN LATERAL (VALUES (sqlc.arg(merchant_account)::text, 0 - r.amount),
                               (sqlc.arg(customer_account_prefix)::text || t.customer_id, r.amount)) AS e (account, amount)
)
SELECT customer_id FROM taken;

-- name: RefundMarkSucceeded :execrows
-- Marks the pending refund succeeded and writes its half of the provider
-- event's confirmation, as the workflow's finalize step does (see
-- queries/refund/refund.sql): the same writes, without the engine.
WITH marked AS (
    UPDATE demo_refund
    SET status = 'succeeded', provider_refund_id = sqlc.arg(provider_refund_id)::text, updated_at = clock_timestamp()
    WHERE id = sqlc.arg(id)::text AND status = 'pending'
    RETURNING id, provider_refund_id
)
INSERT INTO demo_refund_confirmation AS c (provider_refund_id, refund_id)
SELECT m.provider_refund_id, m.id FROM marked AS m
ON CONFLICT (provider_refund_id) DO UPDATE
SET refund_id = excluded.refund_id,
    confirmed_at = CASE
        WHEN c.event_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM demo_refund AS r
            CROSS JOIN jsonb_array_elements(c.event_facts) AS f (fact)
            WHERE r.id = excluded.refund_id AND r.order_id = f.fact ->> 0 AND r.amount = (f.fact ->> 1)::bigint)
        THEN coalesce(c.confirmed_at, clock_timestamp()) END;
