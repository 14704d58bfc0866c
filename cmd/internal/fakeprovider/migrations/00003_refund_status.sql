-- A refund's status: "succeeded" at once, as every refund was before, or
-- "pending" (a refund made under the fault "pending"), which becomes its
-- outcome, "succeeded" or "failed", at settles_at. A failed refund paid
-- nothing. The transition lives in the row, not in a process's timer, so that
-- a pending refund whose time came while no process ran still settles: on the
-- next read of it, or by the next process that runs the settler.
ALTER TABLE provider.refund
    ADD COLUMN status text NOT NULL DEFAULT 'succeeded' CHECK (status IN ('pending', 'succeeded', 'failed')),
    -- What a refund made pending becomes, and when; kept once it has.
    ADD COLUMN outcome text CHECK (outcome IN ('succeeded', 'failed')),
    ADD COLUMN settles_at timestamptz,
    -- The webhook event that a refund made pending makes when it settles (in
    -- the statement that settles it), when the process that recorded it sends
    -- webhooks: its id and its body, which names the outcome.
    ADD COLUMN settle_event_id text CHECK (settle_event_id LIKE 'evt\_%'),
    ADD COLUMN settle_event_body text,
    ADD CONSTRAINT refund_pending_settles CHECK (status <> 'pending' OR (outcome IS NOT NULL AND settles_at IS NOT NULL)),
    ADD CONSTRAINT refund_outcome CHECK (outcome IS NULL OR status IN ('pending', outcome)),
    ADD CONSTRAINT refund_settle_event CHECK ((settle_event_id IS NULL) = (settle_event_body IS NULL));

-- The pending refunds, by when they settle.
CREATE INDEX provider_refund_settles ON provider.refund (settles_at) WHERE status = 'pending';
-- GET /refunds: oldest first, and its pages.
CREATE INDEX provider_refund_created ON provider.refund (created_at, id);

-- The fault "pending", and the outcome of the refunds it makes.
ALTER TABLE provider.fault
    DROP CONSTRAINT fault_mode_check,
    ADD CONSTRAINT fault_mode_check CHECK (mode IN ('error', 'lost_response', 'slow', 'pending')),
    ADD COLUMN outcome text NOT NULL DEFAULT 'succeeded' CHECK (outcome IN ('succeeded', 'failed'));

---- create above / drop below ----
DELETE FROM provider.fault WHERE mode = 'pending';
ALTER TABLE provider.fault
    DROP COLUMN outcome,
    DROP CONSTRAINT fault_mode_check,
    ADD CONSTRAINT fault_mode_check CHECK (mode IN ('error', 'lost_response', 'slow'));
DROP INDEX provider.provider_refund_created;
DROP INDEX provider.provider_refund_settles;
-- The older schema knows only refunds that paid: one that failed, or will,
-- goes, with its event; one that will succeed stays, as if it had already.
DELETE FROM provider.webhook_event WHERE refund_id IN (SELECT id FROM provider.refund WHERE outcome = 'failed');
DELETE FROM provider.refund WHERE outcome = 'failed';
ALTER TABLE provider.refund
    DROP COLUMN settle_event_body,
    DROP COLUMN settle_event_id,
    DROP COLUMN settles_at,
    DROP COLUMN outcome,
    DROP COLUMN status;
