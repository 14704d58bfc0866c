-- When a finished operation, and so its key, may be deleted: set when it
-- finishes, from its type's retention in the process that finished it, so that
-- a later deploy that shortens the retention, or a process that does not run
-- the type, never frees a key earlier than the service promised when it
-- answered. Operations that finished before this migration have none; the
-- retention job deletes those as it did, by each type's retention.
ALTER TABLE idemflow_operation ADD COLUMN expires_at timestamptz;

-- The retention job's scan, by expiry; its legacy rows are the NULLs at the
-- end. It replaces the index by finished_at.
CREATE INDEX idemflow_operation_expires_at ON idemflow_operation (expires_at)
    WHERE state <> 'in_progress';
DROP INDEX idemflow_operation_finished_at;

---- create above / drop below ----

CREATE INDEX idemflow_operation_finished_at ON idemflow_operation (finished_at)
    WHERE state <> 'in_progress';
DROP INDEX idemflow_operation_expires_at;
ALTER TABLE idemflow_operation DROP COLUMN expires_at;
