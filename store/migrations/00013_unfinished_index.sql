---- tern: disable-tx ----
-- One index of the unfinished operations instead of two. The sweeper's scan
-- (OperationListExpired) reads the range (name, version, parked = false) in
-- lease order; the gauges (OperationInProgressStats) and the pre-deploy check
-- read every entry, parked ones included. Each INSERT and non-HOT UPDATE of an
-- operation opened both indexes and wrote an entry to each.
--
-- Built and dropped CONCURRENTLY, outside a transaction (each statement on its
-- own), so that running processes go on reading and writing the table while
-- it reads it. Each statement may be run again: a build that failed half way
-- leaves an invalid index, which the first statement drops.
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_unfinished;
CREATE INDEX CONCURRENTLY idemflow_operation_unfinished ON idemflow_operation (name, version, parked, locked_until)
    WHERE state = 'in_progress';
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_lease;
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_in_progress;

---- create above / drop below ----

---- tern: disable-tx ----
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_lease;
CREATE INDEX CONCURRENTLY idemflow_operation_lease ON idemflow_operation (name, version, locked_until)
    WHERE state = 'in_progress' AND NOT parked;
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_in_progress;
CREATE INDEX CONCURRENTLY idemflow_operation_in_progress ON idemflow_operation (name, created_at)
    WHERE state = 'in_progress';
DROP INDEX CONCURRENTLY IF EXISTS idemflow_operation_unfinished;
