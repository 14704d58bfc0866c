-- key_secret: 16 random bytes chosen at reservation, from which (with the
-- operation's id) the derived keys of its external steps come (scheme idf2_), so
-- that a new operation under a key that was used before never meets the old
-- one's records at a provider, and nobody can compute a key in advance. Null for
-- operations reserved before this migration: they keep their idf1_ keys.
-- attention_code, attention: why an unfinished operation waits for an operator
-- (null: it does not). parked: no run takes the operation up again (the sweeper
-- skips it, a resume job does not claim it) until an operator retries or
-- cancels it.
ALTER TABLE idemflow_operation
    ADD COLUMN key_secret     bytea,
    ADD COLUMN attention_code text,
    ADD COLUMN attention      text,
    ADD COLUMN parked         boolean NOT NULL DEFAULT false;

-- The sweeper's scan leaves parked operations out.
DROP INDEX idemflow_operation_lease;
CREATE INDEX idemflow_operation_lease ON idemflow_operation (locked_until)
    WHERE state = 'in_progress' AND NOT parked;

-- last_error is for the client; last_cause is the operator's (SQL text, URLs,
-- stacks). resolved_by says, for an external step that succeeded, whether its own
-- call or a lookup by derived key gave its outcome. compensations counts the
-- failed attempts of the step's compensation, which runs one run after another.
ALTER TABLE idemflow_step
    ADD COLUMN last_cause    text,
    ADD COLUMN resolved_by   text CHECK (resolved_by IN ('call', 'lookup')),
    ADD COLUMN compensations integer NOT NULL DEFAULT 0;

---- create above / drop below ----
DROP INDEX idemflow_operation_lease;
CREATE INDEX idemflow_operation_lease ON idemflow_operation (locked_until)
    WHERE state = 'in_progress';
ALTER TABLE idemflow_step DROP COLUMN compensations, DROP COLUMN resolved_by, DROP COLUMN last_cause;
ALTER TABLE idemflow_operation DROP COLUMN parked, DROP COLUMN attention, DROP COLUMN attention_code, DROP COLUMN key_secret;
