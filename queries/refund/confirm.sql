-- name: ProviderEventRecord :exec
-- Records a provider's event about one of its refunds, and confirms the refund
-- when its finalize step has recorded it, in one statement that fails when the
-- event is recorded already: the confirm step sends it with engine.AtCommit.
-- The confirmation's row is where the event meets the refund (see
-- RefundMarkSucceeded): ON CONFLICT DO UPDATE waits for a concurrent writer of
-- the row and then reads the version it committed, so the half that comes
-- second confirms, whichever it is.
WITH event AS (
    INSERT INTO demo_provider_event (event_id, type, provider_refund_id, order_id, amount, operation_id)
    VALUES (@event_id, @type, @provider_refund_id, @order_id, @amount, @operation_id)
    RETURNING event_id, provider_refund_id
)
INSERT INTO demo_refund_confirmation AS c (provider_refund_id, event_id)
SELECT e.provider_refund_id, e.event_id FROM event AS e
ON CONFLICT (provider_refund_id) DO UPDATE
SET event_id = coalesce(c.event_id, excluded.event_id),
    confirmed_at = CASE WHEN c.refund_id IS NULL THEN NULL
                        ELSE coalesce(c.confirmed_at, clock_timestamp()) END;

-- name: RefundConfirmed :one
-- Whether the provider's event about a refund was applied to it.
SELECT EXISTS (
    SELECT 1 FROM demo_refund_confirmation WHERE refund_id = sqlc.arg(refund_id)::text AND confirmed_at IS NOT NULL
) AS confirmed;
