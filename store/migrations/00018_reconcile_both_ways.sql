-- Reconciliation both ways: the books' succeeded steps are checked against
-- the outside services' records too (a step whose record is missing), and a
-- record may be wrong in more than one way at once.
--
-- A mismatch is kept per kind: one row per (source, record key, reference,
-- kind), so that an event that finds a record_failed does not replace the
-- reference_differs a run found under the same key and reference (nor the
-- other way round). A missing_record's reference is the one the books hold.
ALTER TABLE idemflow_mismatch
    DROP CONSTRAINT idemflow_mismatch_pkey,
    ADD PRIMARY KEY (source, record_key, reference, kind);

-- An external step's checkpoint (store migration 00010) may now carry "f":
-- the outside service's reference for what it made, as its definition reads
-- it from the state after the step, which a succeeded operation's last
-- checkpoints leave out. No change of schema: the view and the binaries
-- before this one ignore it.
--
-- A run's report counts the books' succeeded steps it checked for a record
-- (steps_checked), and the records under keys of operations that the
-- retention job may have deleted (expired): judged against nothing, they are
-- not unknown keys.
ALTER TABLE idemflow_reconciliation
    ADD COLUMN steps_checked bigint NOT NULL DEFAULT 0,
    ADD COLUMN expired       bigint NOT NULL DEFAULT 0;

---- create above / drop below ----

ALTER TABLE idemflow_reconciliation DROP COLUMN expired, DROP COLUMN steps_checked;
-- One row per (source, record key, reference) again: the oldest kind stays.
DELETE FROM idemflow_mismatch AS m
USING idemflow_mismatch AS o
WHERE o.source = m.source AND o.record_key = m.record_key AND o.reference = m.reference
  AND (o.first_seen, o.kind) < (m.first_seen, m.kind);
ALTER TABLE idemflow_mismatch
    DROP CONSTRAINT idemflow_mismatch_pkey,
    ADD PRIMARY KEY (source, record_key, reference);
