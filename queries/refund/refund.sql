-- name: RefundRecord :exec
-- Records a pending refund of amount of an order and its ledger move, in one
-- statement that fails the step for good (idemflow_fail) when the client has no
-- such order, or less than amount left to refund of it: the ledger step sends it
-- with engine.AtCommit, with its checkpoint and COMMIT, and never reads its
-- result. The failures' codes are parameters, so that Go keeps their names.
--
-- taken takes amount from what is left to refund of the order, and only if it
-- is left: under READ COMMITTED, an UPDATE that waited for the row lock of a
-- concurrent refund checks its WHERE again on the row that refund left, so
-- refunds of one order never take more than its amount together (a read of the
-- order or its refunds in the same statement would not do: it would see them as
-- of the statement's start, before the wait). From the order it took, the
-- statement inserts the refund, with the operation that records it, and moves
-- amount from the merchant's account to the order's customer's
-- (customer_account_prefix and the customer id): two entries that sum to zero.
--
-- Only when taken took nothing does the statement read the order, locking it,
-- which returns its newest version, to tell the failures apart and say how much
-- is left. If that much fits after all (a failed refund gave its amount back in
-- between), it fails with an ordinary error: the engine tries the step again.
-- That is demo_check's, not idemflow_check's, which would fail the step for
-- good.
WITH taken AS (
    UPDATE demo_order AS o
    SET refunded = o.refunded + sqlc.arg(amount)::bigint
    WHERE o.client = @client AND o.order_id = @order_id
      AND sqlc.arg(amount)::bigint <= o.amount - o.refunded
    RETURNING o.client, o.order_id, o.customer_id
), refund AS (
    INSERT INTO demo_refund (id, client, order_id, amount, operation_id)
    SELECT sqlc.arg(id)::text, t.client, t.order_id, sqlc.arg(amount)::bigint, sqlc.arg(operation_id)::uuid
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
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM taken) THEN true
    ELSE (
        SELECT CASE
            WHEN l.amount_left IS NULL THEN
                idemflow_fail(sqlc.arg(order_not_found_code)::text, format('order %s does not exist', @order_id::text))
            WHEN sqlc.arg(amount)::bigint > l.amount_left THEN
                idemflow_fail(sqlc.arg(amount_exceeded_code)::text, format('amount %s exceeds the %s left to refund of order %s',
                              sqlc.arg(amount)::bigint, l.amount_left, @order_id::text))
            ELSE
                demo_check(false, format('order %s had less than %s left to refund, and has %s now',
                           @order_id::text, sqlc.arg(amount)::bigint, l.amount_left))
        END
        FROM (SELECT (SELECT ord.amount - ord.refunded
                      FROM demo_order AS ord
                      WHERE ord.client = @client AND ord.order_id = @order_id
                      FOR UPDATE) AS amount_left) AS l
    )
END;

-- name: RefundFail :execrows
-- Compensates RefundRecord, in one statement: marks a pending refund failed,
-- moves its amount back from the order's customer's account
-- (customer_account_prefix and the customer id) to merchant_account, two
-- entries that sum to zero, and gives the amount back to what is left to refund
-- of its order. One row: the order's. Zero rows: the refund is not pending, and
-- nothing was written.
WITH failed AS (
    UPDATE demo_refund AS r
    SET status = 'failed', updated_at = clock_timestamp()
    WHERE r.id = @id AND r.status = 'pending'
    RETURNING r.id, r.client, r.order_id, r.amount
), entries AS (
    INSERT INTO demo_ledger_entry (client, move_id, account, amount, kind, order_id, refund_id)
    SELECT f.client, @move_id, e.account, e.amount, 'refund_reversal', f.order_id, f.id
    FROM failed AS f
    JOIN demo_order AS o ON o.client = f.client AND o.order_id = f.order_id
    CROSS JOIN LATERAL (VALUES (sqlc.arg(customer_account_prefix)::text || o.customer_id, 0 - f.amount),
                               (sqlc.arg(merchant_account)::text, f.amount)) AS e (account, amount)
)
UPDATE demo_order AS o
SET refunded = o.refunded - f.amount
FROM failed AS f
WHERE o.client = f.client AND o.order_id = f.order_id;

-- name: RefundMarkSucceeded :exec
-- Marks a pending refund succeeded, and fails the step for good
-- (idemflow_check) when it is not pending: the finalize step sends it with
-- engine.AtCommit, with its checkpoint and COMMIT, so it must fail on its own
-- rather than report no row. No retry would make the refund pending again:
-- the only other statement that changes a recorded refund, the ledger's
-- compensation, never runs past the provider step, and this one commits with
-- its step's checkpoint, so it never runs twice. Finalize runs past that point of no return, so the engine parks the
-- operation for an operator (engine.CodeFailedPastPivot) rather than retry it
-- at the cap forever. The code is written here rather than passed from Go as
-- RefundRecord's are: it never reaches a client, it only names the failure in
-- the operator's reason.
--
-- It called demo_check (an ordinary error, retried) before idemflow_check
-- existed. demo_check stays (workflows/refund/migrations/00003_check.sql):
-- RefundRecord still calls it for the failure the engine must retry, and a
-- binary older than this one, which calls it here, may still run during a
-- deploy.
--
-- met writes the refund's half of its confirmation (see ProviderEventRecord):
-- when the provider's event about the refund came first, and was kept, the
-- refund is confirmed here, if one of the events' order and amount are the
-- refund's.
WITH marked AS (
    UPDATE demo_refund
    SET status = 'succeeded', provider_refund_id = sqlc.arg(provider_refund_id)::text, updated_at = clock_timestamp()
    WHERE id = sqlc.arg(id)::text AND status = 'pending'
    RETURNING id, provider_refund_id
), met AS (
    INSERT INTO demo_refund_confirmation AS c (provider_refund_id, refund_id)
    SELECT m.provider_refund_id, m.id FROM marked AS m
    ON CONFLICT (provider_refund_id) DO UPDATE
    SET refund_id = excluded.refund_id,
        confirmed_at = CASE
            WHEN c.event_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM demo_refund AS r
                CROSS JOIN jsonb_array_elements(c.event_facts) AS f (fact)
                WHERE r.id = excluded.refund_id AND r.order_id = f.fact ->> 0 AND r.amount = (f.fact ->> 1)::bigint)
            THEN coalesce(c.confirmed_at, clock_timestamp()) END
)
SELECT idemflow_check(EXISTS (SELECT 1 FROM marked), 'refund_not_pending',
                      format('refund %s is not pending', sqlc.arg(id)::text));

-- name: RefundGet :one
-- The refund, and whether the provider's event about it was applied.
SELECT r.*, EXISTS (
    SELECT 1 FROM demo_refund_confirmation AS c WHERE c.refund_id = r.id AND c.confirmed_at IS NOT NULL
) AS confirmed
FROM demo_refund AS r
WHERE r.client = @client AND r.id = @id;

-- name: RefundListByOrder :many
SELECT * FROM demo_refund
WHERE client = @client AND order_id = @order_id
ORDER BY created_at, id;

-- name: RefundSetReceipt :exec
-- Gives a succeeded refund its receipt number, once: the receipt step (version
-- 2) sends it with engine.AtCommit, so it fails on its own, for good
-- (idemflow_check), when the refund is not succeeded or has another receipt
-- already; a retried step's transaction never committed, so its own receipt
-- is never there.
WITH given AS (
    UPDATE demo_refund
    SET receipt = sqlc.arg(receipt)::text, updated_at = clock_timestamp()
    WHERE id = sqlc.arg(id)::text AND status = 'succeeded' AND receipt IS NULL
    RETURNING id
)
SELECT idemflow_check(EXISTS (SELECT 1 FROM given), 'refund_receipt_refused',
                      format('refund %s is not succeeded, or has a receipt already', sqlc.arg(id)::text));

-- name: RefundListByOperation :many
-- The refunds that the operations recorded (their ledger step), one per
-- operation: the newest, should an operation reopened by an operator have
-- recorded another after its first was reversed.
SELECT DISTINCT ON (operation_id) operation_id::uuid AS operation_id, client, order_id, amount
FROM demo_refund
WHERE operation_id = ANY(sqlc.arg(operation_ids)::uuid[])
ORDER BY operation_id, created_at DESC, id DESC;
