-- name: ProviderEventRecord :exec
-- Records a provider's event about one of its refunds, and confirms the refund
-- when its finalize step has recorded it, in one statement: the webhook
-- endpoint's, in the transaction that keeps the event in the engine's inbox
-- (body_fields set, operation_id NULL), or the confirm step's of a
-- provider_event operation started before (body_fields NULL), sent with
-- engine.AtCommit. An event recorded already (a delivery again; the same id
-- under another key, which ProviderEventBodyFields then refuses) changes
-- nothing: the event is applied once, however often it comes (demo migration
-- 00005's comment, that a second run of the step fails on the key, predates
-- this).
-- The confirmation's row is where the event meets the refund (see
-- RefundMarkSucceeded): ON CONFLICT DO UPDATE waits for a concurrent writer of
-- the row and then reads the version it committed, so the half that comes
-- second confirms, whichever it is, and only when an event's order and amount
-- are the refund's (event_facts keeps those of every event; the refund's are
-- never updated, so the statement's snapshot reads them right).
WITH event AS (
    INSERT INTO demo_provider_event (event_id, type, provider_refund_id, order_id, amount, operation_id, body_fields)
    VALUES (@event_id, @type, @provider_refund_id, @order_id, @amount, sqlc.narg('operation_id'), sqlc.narg('body_fields')::jsonb)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, provider_refund_id, order_id, amount
)
INSERT INTO demo_refund_confirmation AS c (provider_refund_id, event_id, event_facts)
SELECT e.provider_refund_id, e.event_id, jsonb_build_array(jsonb_build_array(e.order_id, e.amount)) FROM event AS e
ON CONFLICT (provider_refund_id) DO UPDATE
SET event_id = coalesce(c.event_id, excluded.event_id),
    event_facts = c.event_facts || excluded.event_facts,
    confirmed_at = CASE
        WHEN c.confirmed_at IS NOT NULL THEN c.confirmed_at
        WHEN c.refund_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM demo_refund AS r
            WHERE r.id = c.refund_id
              AND r.order_id = excluded.event_facts -> 0 ->> 0
              AND r.amount = (excluded.event_facts -> 0 ->> 1)::bigint)
        THEN clock_timestamp() END;

-- name: ProviderEventBodyFields :one
-- The digests of the body's top-level fields of the event recorded under an
-- id (NULL for an event recorded before demo migration 00009), read after
-- ProviderEventRecord in the same transaction: its ON CONFLICT waited for a
-- concurrent delivery of the id to commit, so this reads the body that was
-- kept, whichever delivery came first.
SELECT body_fields FROM demo_provider_event WHERE event_id = @event_id;

-- name: RefundConfirmed :one
-- Whether the provider's event about a refund was applied to it.
SELECT EXISTS (
    SELECT 1 FROM demo_refund_confirmation WHERE refund_id = sqlc.arg(refund_id)::text AND confirmed_at IS NOT NULL
) AS confirmed;
