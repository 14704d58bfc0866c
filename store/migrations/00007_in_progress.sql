-- The gauges of unfinished operations (engine.InProgress) read this index
-- only: per name, how many operations are in progress and the oldest one's
-- start.
CREATE INDEX idemflow_operation_in_progress ON idemflow_operation (name, created_at)
    WHERE state = 'in_progress';

---- create above / drop below ----

DROP INDEX idemflow_operation_in_progress;
