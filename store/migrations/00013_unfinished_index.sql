-- One index of the unfinished operations instead of two. The sweeper's scan
-- (OperationListExpired) reads the range (name, version, parked = false) in
-- lease order; the gauges (OperationInProgressStats) and the pre-deploy check
-- read every entry, parked ones included. Each INSERT and non-HOT UPDATE of an
-- operation opened both indexes and wrote an entry to each.
--
-- The lock that DROP INDEX needs is taken first, so that no weaker one (the
-- SHARE lock of CREATE INDEX) is held while asking for it: a running
-- process's transaction that read a row FOR SHARE and then updates it would
-- wait across that upgrade, a deadlock. Reads and writes of the table wait
-- while the index is built (it reads the table: 0.3 s for a million
-- operations in memory, more from disk). Not CONCURRENTLY: a concurrent build waits for every older
-- transaction of the database, the other processes' waits on the migrations'
-- advisory lock included, which wait for it in turn.
LOCK TABLE idemflow_operation IN ACCESS EXCLUSIVE MODE;
CREATE INDEX idemflow_operation_unfinished ON idemflow_operation (name, version, parked, locked_until)
    WHERE state = 'in_progress';
DROP INDEX idemflow_operation_lease;
DROP INDEX idemflow_operation_in_progress;

---- create above / drop below ----

LOCK TABLE idemflow_operation IN ACCESS EXCLUSIVE MODE;
CREATE INDEX idemflow_operation_lease ON idemflow_operation (name, version, locked_until)
    WHERE state = 'in_progress' AND NOT parked;
CREATE INDEX idemflow_operation_in_progress ON idemflow_operation (name, created_at)
    WHERE state = 'in_progress';
DROP INDEX idemflow_operation_unfinished;
