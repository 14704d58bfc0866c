-- The provider's events are recorded by the webhook endpoint itself
-- (entry/webhook's Outcomes), in the transaction that keeps the event in the
-- engine's inbox, no longer by an operation of their own: operation_id names
-- the provider_event operation of an event recorded before, and is NULL for
-- those recorded since.
--
-- body_fields keeps, for each top-level field of the event's body, a digest of
-- its JSON value ({"id": "<sha256 hex>", "type": ..., "data": ...}), so that an
-- event id that comes again with another body is refused, naming the fields that
-- differ, even under another idempotency key, which the engine's inbox (keyed by
-- the derived key and the event id) takes for a new event. NULL for the events
-- recorded before: their id is checked by the inbox alone.
ALTER TABLE demo_provider_event ALTER COLUMN operation_id DROP NOT NULL;
ALTER TABLE demo_provider_event ADD COLUMN body_fields jsonb;

---- create above / drop below ----

ALTER TABLE demo_provider_event DROP COLUMN body_fields;
-- The events recorded without an operation get the nil uuid: the confirmations
-- reference them, so they stay.
UPDATE demo_provider_event SET operation_id = '00000000-0000-0000-0000-000000000000' WHERE operation_id IS NULL;
ALTER TABLE demo_provider_event ALTER COLUMN operation_id SET NOT NULL;
