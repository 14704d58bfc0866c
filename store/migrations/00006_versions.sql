-- version: the version of the operation type's definition that the operation
-- started on, and always runs on. Operations reserved before this migration
-- started on version 1, the only one there was.
ALTER TABLE idemflow_operation
    ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version >= 1);

-- The sweeper scans, for each (name, version) that its process runs, the
-- expired leases of that definition only: operations that wait for a version
-- no process here runs cost the scan nothing.
DROP INDEX idemflow_operation_lease;
CREATE INDEX idemflow_operation_lease ON idemflow_operation (name, version, locked_until)
    WHERE state = 'in_progress' AND NOT parked;

---- create above / drop below ----

DROP INDEX idemflow_operation_lease;
CREATE INDEX idemflow_operation_lease ON idemflow_operation (locked_until)
    WHERE state = 'in_progress' AND NOT parked;
ALTER TABLE idemflow_operation DROP COLUMN version;
