-- A webhook event from the provider, as the webhook received it: one row per
-- event id, inserted by the confirm step of the event's operation, once (a
-- plain INSERT: a second run of the step would fail on the key).
CREATE TABLE demo_provider_event (
    event_id            text        PRIMARY KEY,
    type                text        NOT NULL,
    provider_refund_id  text        NOT NULL CHECK (provider_refund_id <> ''),
    order_id            text        NOT NULL,
    amount              bigint      NOT NULL,
    operation_id        uuid        NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Where a provider refund's event meets the refund: the event's confirm step and
-- the refund's finalize step each write their half, with INSERT ... ON CONFLICT
-- DO UPDATE on the provider refund id, whichever comes first. The second waits
-- for the first to commit, and then sees its half, so that the refund is
-- confirmed (confirmed_at) once, when both halves are there, however the two
-- race. An event for a refund not finalized yet is kept here until it is.
CREATE TABLE demo_refund_confirmation (
    provider_refund_id  text        PRIMARY KEY,
    -- The demo's refund, once its finalize step recorded the provider's id.
    refund_id           text        UNIQUE REFERENCES demo_refund (id),
    -- The first event about the refund.
    event_id            text        REFERENCES demo_provider_event (event_id),
    confirmed_at        timestamptz,
    CONSTRAINT demo_refund_confirmation_both CHECK (confirmed_at IS NULL OR (refund_id IS NOT NULL AND event_id IS NOT NULL))
);

---- create above / drop below ----
DROP TABLE demo_refund_confirmation;
DROP TABLE demo_provider_event;
