-- Raises message when ok is false. A statement that a step sends with
-- engine.AtCommit cannot report "no row" to the step, which never sees its
-- result: it calls this to fail instead, which fails the step's attempt.
CREATE FUNCTION demo_check(ok boolean, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION '%', message;
    END IF;
    RETURN true;
END
$$;

---- create above / drop below ----
DROP FUNCTION demo_check(boolean, text);
