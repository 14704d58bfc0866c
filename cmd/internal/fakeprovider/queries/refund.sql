-- name: RefundUpsert :one
-- Makes the refund asked for under an idempotency key, or, when the key has one
-- already, counts the request against it and answers that refund unchanged.
-- With an outcome, the refund is made pending: it becomes outcome settle_ms
-- from now (see RefundSettleDue), and makes the event settle_event_id then.
-- Without one it succeeds at once, and gets its webhook event in the same
-- statement when event_id is not null: the event's body names the refund's
-- id, which is the one given here only on the first request. With
-- lookup_lag_ms, a refund made here is not found by its key's lookup until
-- that long from now (see RefundLookupLags).
WITH ref AS (
    INSERT INTO provider.refund (id, idempotency_key, order_id, amount, reference,
                                 status, outcome, settles_at, settle_event_id, settle_event_body, lookup_after)
    VALUES (@id, @idempotency_key, @order_id, @amount, @reference,
            CASE WHEN sqlc.narg(outcome)::text IS NULL THEN 'succeeded' ELSE 'pending' END,
            sqlc.narg(outcome)::text,
            clock_timestamp() + sqlc.narg(settle_ms)::bigint * interval '1 millisecond',
            sqlc.narg(settle_event_id)::text, sqlc.narg(settle_event_body)::text,
            clock_timestamp() + sqlc.narg(lookup_lag_ms)::bigint * interval '1 millisecond')
    ON CONFLICT (idempotency_key) DO UPDATE
    SET requests = provider.refund.requests + 1
    RETURNING *
), event AS (
    INSERT INTO provider.webhook_event (id, refund_id, type, body)
    SELECT sqlc.narg(event_id)::text, ref.id, sqlc.arg(event_type)::text, sqlc.arg(event_body)::text
    FROM ref
    WHERE ref.requests = 1 AND ref.status = 'succeeded' AND sqlc.narg(event_id)::text IS NOT NULL
    RETURNING id
)
SELECT ref.id, ref.idempotency_key, ref.order_id, ref.amount, ref.reference, ref.requests, ref.created_at,
       ref.status, (SELECT count(*) FROM event) > 0 AS event_made
FROM ref;

-- name: RefundGetByKey :one
SELECT * FROM provider.refund WHERE idempotency_key = @idempotency_key;

-- name: RefundLookupLags :one
-- Whether the lookup under the idempotency key does not find its refund yet:
-- the refund was made under the fault lagging_lookup, and its lookup_after
-- has not come by the database's clock. No row: no refund under the key.
SELECT coalesce(lookup_after > clock_timestamp(), false)::boolean AS lags
FROM provider.refund WHERE idempotency_key = @idempotency_key;

-- name: RefundCreatedAt :one
-- When the refund with this id was made, for GET /refunds?after=.
SELECT created_at FROM provider.refund WHERE id = @id;

-- name: RefundList :many
-- The refunds, oldest first: those made after created_after, if given, and
-- after the refund (after_created_at, after_id), if given; at most max, if
-- given.
SELECT * FROM provider.refund AS r
WHERE (sqlc.narg(created_after)::timestamptz IS NULL OR r.created_at > sqlc.narg(created_after)::timestamptz)
  AND (sqlc.narg(after_id)::text IS NULL
       OR (r.created_at, r.id) > (sqlc.narg(after_created_at)::timestamptz, sqlc.narg(after_id)::text))
ORDER BY r.created_at, r.id
LIMIT sqlc.narg(max)::int;

-- name: RefundSettleDue :many
-- Settles the pending refunds whose time has come, at most max of them, those
-- that another statement is settling left to it: each becomes its outcome,
-- and makes its webhook event, if it has one, in this statement (so that no
-- refund settles without its event, whatever crashes). Answers the refunds
-- settled, with their new status and whether each made an event.
WITH settled AS (
    UPDATE provider.refund AS r
    SET status = r.outcome
    WHERE r.status = 'pending' AND r.id IN (
        SELECT d.id FROM provider.refund AS d
        WHERE d.status = 'pending' AND d.settles_at <= clock_timestamp()
        ORDER BY d.settles_at
        LIMIT sqlc.arg(max)::int
        FOR UPDATE SKIP LOCKED
    )
    RETURNING r.id, r.idempotency_key, r.status, r.settle_event_id, r.settle_event_body
), event AS (
    INSERT INTO provider.webhook_event (id, refund_id, type, body)
    SELECT s.settle_event_id, s.id, s.settle_event_body::json ->> 'type', s.settle_event_body
    FROM settled AS s
    WHERE s.settle_event_id IS NOT NULL
    RETURNING id
)
SELECT s.id, s.idempotency_key, s.status, (s.settle_event_id IS NOT NULL)::boolean AS event_made
FROM settled AS s;

-- name: RefundSettleKey :many
-- Settles the refund made under an idempotency key, if it is pending and its
-- time has come, as RefundSettleDue does; it waits for a statement that is
-- settling it already, and then leaves it.
WITH settled AS (
    UPDATE provider.refund AS r
    SET status = r.outcome
    WHERE r.idempotency_key = @idempotency_key AND r.status = 'pending' AND r.settles_at <= clock_timestamp()
    RETURNING r.id, r.idempotency_key, r.status, r.settle_event_id, r.settle_event_body
), event AS (
    INSERT INTO provider.webhook_event (id, refund_id, type, body)
    SELECT s.settle_event_id, s.id, s.settle_event_body::json ->> 'type', s.settle_event_body
    FROM settled AS s
    WHERE s.settle_event_id IS NOT NULL
    RETURNING id
)
SELECT s.id, s.idempotency_key, s.status, (s.settle_event_id IS NOT NULL)::boolean AS event_made
FROM settled AS s;

-- name: RefundNextSettle :one
-- How long until the next pending refund is due to settle, in milliseconds (0
-- or less: one is due now), or none_ms when no refund is pending.
SELECT coalesce(ceil(extract(epoch FROM min(settles_at) - clock_timestamp()) * 1000)::bigint, sqlc.arg(none_ms)::bigint)::bigint AS wait_ms
FROM provider.refund
WHERE status = 'pending';
