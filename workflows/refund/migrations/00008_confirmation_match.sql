-- The order and amount of each event about a provider refund, kept where the
-- events meet the refund ([[order, amount], ...]), so that the half that comes
-- second compares them with the refund's: an event that names the refund's
-- provider id with another order or amount does not confirm it, and does not
-- keep a later, right one from confirming it either.
ALTER TABLE demo_refund_confirmation ADD COLUMN event_facts jsonb NOT NULL DEFAULT '[]';

UPDATE demo_refund_confirmation AS c
SET event_facts = jsonb_build_array(jsonb_build_array(e.order_id, e.amount))
FROM demo_provider_event AS e
WHERE e.event_id = c.event_id;

---- create above / drop below ----

ALTER TABLE demo_refund_confirmation DROP COLUMN event_facts;
