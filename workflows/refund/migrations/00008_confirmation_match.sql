-- The order and amount of the event that confirms a refund, kept where the event
-- meets the refund, so that the second half to come compares them with the
-- refund's: an event that names the refund's provider id with another order or
-- amount does not confirm it.
ALTER TABLE demo_refund_confirmation
    ADD COLUMN event_order_id text,
    ADD COLUMN event_amount   bigint;

UPDATE demo_refund_confirmation AS c
SET event_order_id = e.order_id, event_amount = e.amount
FROM demo_provider_event AS e
WHERE e.event_id = c.event_id;

---- create above / drop below ----

ALTER TABLE demo_refund_confirmation DROP COLUMN event_amount, DROP COLUMN event_order_id;
