-- Raises when a run's write was fenced out: another run recorded the step first,
-- or no longer lets this run end the operation. A checkpoint that fails this way
-- aborts its transaction, so a COMMIT sent in the same round trip after it cannot
-- commit the step's writes without their checkpoint. SQLSTATE IF001 is idemflow's.
CREATE FUNCTION idemflow_fence(held boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT held THEN
        RAISE EXCEPTION 'idemflow: another run holds the operation' USING ERRCODE = 'IF001';
    END IF;
    RETURN true;
END
$$;

---- create above / drop below ----
DROP FUNCTION idemflow_fence(boolean);
