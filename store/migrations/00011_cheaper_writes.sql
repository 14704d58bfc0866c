-- What every write of an operation costs PostgreSQL, made smaller without
-- changing what the schema promises (00012 and 00013 go on with it). Its
-- ALTER TABLE comes first, so that the lock it needs (ACCESS EXCLUSIVE, held
-- to the end, and brief: it reads no row) is the first this migration takes on
-- the table, never a stronger one asked for while a weaker one is held, which
-- a transaction of a running process could wait across.
--
-- The checks of state and finished_at as one CASE. PostgreSQL reads each
-- CHECK expression of a table back from the catalog and prepares it again for
-- every INSERT and UPDATE statement; the IN list's array constant made that
-- the dearest part of both writes of an operation. A row may hold what it
-- could before. It is added NOT VALID, which checks every row written from
-- now on but not the rows there (the two checks it replaces held for each), so
-- that no row is read under the lock; migration 00012 validates it under one
-- that lets reads and writes go on.
ALTER TABLE idemflow_operation
    ADD CONSTRAINT idemflow_operation_state CHECK (CASE state
        WHEN 'in_progress' THEN finished_at IS NULL
        WHEN 'succeeded' THEN finished_at IS NOT NULL
        WHEN 'failed' THEN finished_at IS NOT NULL
        ELSE false
    END) NOT VALID,
    DROP CONSTRAINT idemflow_operation_state_check,
    DROP CONSTRAINT idemflow_operation_finished;

-- The guards as SQL functions of one CASE, which PostgreSQL inlines into the
-- statement's plan: the plpgsql function behind the failure is called only
-- when the guard fails, not on every statement that passes (a plpgsql call,
-- and the message's format(), on the hot path of every step). Each returns
-- what it did for every argument (idemflow_fence passes a NULL, idemflow_check
-- fails on one); idemflow_check's code and message are now evaluated only when
-- it fails, so an error in building them no longer fails a check that passes.
-- The raisers stay VOLATILE: that, not the guards' own volatility, keeps the
-- planner from calling one ahead of time with constant arguments.
CREATE FUNCTION idemflow_fence_lost() RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'idemflow: another run holds the operation' USING ERRCODE = 'IF001';
END
$$;
COMMENT ON FUNCTION idemflow_fence_lost() IS
    'idemflow, internal to the engine, not for application SQL: raises SQLSTATE IF001 (idemflow_fence''s failure).';

CREATE OR REPLACE FUNCTION idemflow_fence(held boolean) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE WHEN NOT held THEN idemflow_fence_lost() ELSE true END
$$;

CREATE OR REPLACE FUNCTION idemflow_check(ok boolean, code text, message text) RETURNS boolean
LANGUAGE sql AS $$
    SELECT CASE WHEN ok THEN true ELSE idemflow_fail(code, message) END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION idemflow_check(ok boolean, code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        PERFORM idemflow_fail(code, message);
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION idemflow_fence(held boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT held THEN
        RAISE EXCEPTION 'idemflow: another run holds the operation' USING ERRCODE = 'IF001';
    END IF;
    RETURN true;
END
$$;

DROP FUNCTION idemflow_fence_lost();

ALTER TABLE idemflow_operation
    ADD CONSTRAINT idemflow_operation_state_check CHECK (state IN ('in_progress', 'succeeded', 'failed')),
    ADD CONSTRAINT idemflow_operation_finished CHECK ((state = 'in_progress') = (finished_at IS NULL)),
    DROP CONSTRAINT idemflow_operation_state;
