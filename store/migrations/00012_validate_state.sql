-- Checks the rows written before migration 00011 against its CHECK of state
-- and finished_at, in a transaction of its own: VALIDATE CONSTRAINT reads the
-- whole table under a lock that lets reads and writes go on (SHARE UPDATE
-- EXCLUSIVE), where adding the check valid would have held them off for the
-- whole read.
ALTER TABLE idemflow_operation VALIDATE CONSTRAINT idemflow_operation_state;

---- create above / drop below ----

-- Nothing to undo: a validated constraint is the same constraint. Migration
-- 00011's down drops it.
