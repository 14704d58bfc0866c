-- A webhook event: what the provider tells the merchant about a refund it made,
-- one per refund, inserted by the statement that makes the refund (so that no
-- refund is made without its event, whatever crashes). body is what every
-- delivery sends, byte for byte; only the signature's timestamp changes.
CREATE TABLE provider.webhook_event (
    id               text        PRIMARY KEY CHECK (id LIKE 'evt\_%'),
    refund_id        text        NOT NULL UNIQUE REFERENCES provider.refund (id),
    type             text        NOT NULL,
    body             text        NOT NULL,
    -- The POSTs of the event sent so far: the first, the retries and the
    -- redeliveries asked for.
    deliveries       integer     NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    -- The failed attempts since the last success, for the backoff.
    failures         integer     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    -- When an attempt first got a 2xx; null while undelivered.
    delivered_at     timestamptz,
    -- When the next attempt is due, while undelivered. A sender moves it ahead
    -- when it takes the event, so that no other sender takes it meanwhile.
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The events to send: undelivered, by when they are due.
CREATE INDEX provider_webhook_event_due ON provider.webhook_event (next_attempt_at) WHERE delivered_at IS NULL;

---- create above / drop below ----
DROP TABLE provider.webhook_event;
