-- The fake payment provider keeps its state in a schema of its own, apart from
-- the demo's tables, so that it survives a crash of the demo like a real
-- provider would.
CREATE SCHEMA provider;

-- One row per refund the provider made, keyed by the idempotency key it was asked
-- with: the same key always answers this refund.
CREATE TABLE provider.refund (
    id               text        PRIMARY KEY CHECK (id LIKE 'pr\_%'),
    idempotency_key  text        NOT NULL UNIQUE CHECK (idempotency_key <> ''),
    order_id         text        NOT NULL,
    amount           bigint      NOT NULL CHECK (amount > 0),
    -- The caller's own id for the refund, as it sent it.
    reference        text        NOT NULL,
    -- The POSTs with this key answered with this refund: the first and every repeat.
    requests         integer     NOT NULL DEFAULT 1 CHECK (requests > 0),
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The fault to inject into the next refund POSTs, if any: at most one row, shared
-- by every process that serves the provider from this database.
CREATE TABLE provider.fault (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    mode       text    NOT NULL CHECK (mode IN ('error', 'lost_response', 'slow')),
    -- How many more refund POSTs fail this way.
    remaining  integer NOT NULL CHECK (remaining >= 0),
    -- How long a slow answer waits, in milliseconds.
    delay_ms   integer NOT NULL DEFAULT 0 CHECK (delay_ms >= 0)
);

---- create above / drop below ----
DROP SCHEMA provider CASCADE;
