-- operation_id: the refund operation that recorded the refund (its ledger
-- step), so that what waits in the engine (a refund of version 3 waiting for
-- approval, listed by the engine by operation) can be shown with its client,
-- order and amount. NULL for the refunds recorded before: no refund of
-- version 3 is among them. Nullable and without a default, so that adding it
-- rewrites nothing, and a process of the build before, which records refunds
-- without it, still runs during a deploy.
ALTER TABLE demo_refund ADD COLUMN operation_id uuid;

-- Not unique: an operation reopened by an operator after its ledger move was
-- reversed records its refund again.
CREATE INDEX demo_refund_operation ON demo_refund (operation_id) WHERE operation_id IS NOT NULL;

---- create above / drop below ----

DROP INDEX demo_refund_operation;
ALTER TABLE demo_refund DROP COLUMN operation_id;
