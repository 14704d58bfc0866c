-- name: WebhookTakeDue :many
-- Takes the undelivered events that are due, at most max of them, for one
-- sender, and counts the delivery it is about to make: their next attempt
-- moves claim_ms ahead, so that no other sender (another process on this
-- database) takes them meanwhile; a sender that dies with them leaves them due
-- again then.
UPDATE provider.webhook_event AS e
SET next_attempt_at = clock_timestamp() + sqlc.arg(claim_ms)::bigint * interval '1 millisecond',
    deliveries = e.deliveries + 1
WHERE e.id IN (
    SELECT d.id FROM provider.webhook_event AS d
    WHERE d.delivered_at IS NULL AND d.next_attempt_at <= clock_timestamp()
    ORDER BY d.next_attempt_at
    LIMIT sqlc.arg(max)::int
    FOR UPDATE SKIP LOCKED
)
RETURNING e.id, e.body, e.failures;

-- name: WebhookDelivered :exec
-- Records that a delivery got a 2xx: the event is delivered.
UPDATE provider.webhook_event
SET failures = 0, delivered_at = coalesce(delivered_at, clock_timestamp())
WHERE id = @id;

-- name: WebhookFailed :exec
-- Records that a delivery got no 2xx: an undelivered event is due again after
-- retry_ms.
UPDATE provider.webhook_event
SET failures = CASE WHEN delivered_at IS NULL THEN failures + 1 ELSE failures END,
    next_attempt_at = CASE WHEN delivered_at IS NULL
                           THEN clock_timestamp() + sqlc.arg(retry_ms)::bigint * interval '1 millisecond'
                           ELSE next_attempt_at END
WHERE id = @id;

-- name: WebhookList :many
-- Every event, oldest first.
SELECT id, type, body, deliveries, delivered_at FROM provider.webhook_event ORDER BY created_at, id;

-- name: WebhookCounted :exec
-- Counts a redelivered copy about to be sent, and nothing else: the event's
-- own retries go on as they were.
UPDATE provider.webhook_event SET deliveries = deliveries + 1 WHERE id = @id;
