-- Fails the step whose statement calls it, for good: the engine turns SQLSTATE
-- IF002 into a PermanentError with the code (sent as the error's DETAIL) and
-- the message. It is how a statement sent with engine.AtCommit, whose result
-- the step never sees, ends its operation with a business error of its own.
CREATE FUNCTION idemflow_fail(code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'IF002', MESSAGE = message, DETAIL = code;
END
$$;

---- create above / drop below ----
DROP FUNCTION idemflow_fail(text, text);
