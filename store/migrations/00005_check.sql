-- Returns true when ok is true, and otherwise fails the step whose statement
-- calls it, for good, as idemflow_fail(code, message) does: it calls it, so the
-- error is that one (SQLSTATE IF002, the code as its DETAIL), which the engine
-- turns into a PermanentError with the code and the message. It is the guard of
-- a statement sent with engine.AtCommit, whose result the step never sees, so
-- that the statement fails rather than answer "no row":
--   SELECT idemflow_check(EXISTS (SELECT 1 FROM updated), 'code', 'message')
--
-- A NULL ok fails too (IS NOT TRUE, not NOT: IF takes NOT NULL, which is NULL,
-- for false and would let it through): a guard that a NULL passes is a hole,
-- and a comparison with a missing row's column or an unset parameter is NULL.
-- For the same reason it is not STRICT (which would answer NULL to a NULL
-- argument without running), and it is VOLATILE, the default, so that the
-- planner never evaluates a call ahead of time (one with constant arguments in
-- a CASE branch that is not taken). A NULL code or message, when ok is not
-- true, is the caller's mistake: the RAISE fails with SQLSTATE 22004, an
-- ordinary error, so the statement still fails, but the attempt is retried.
CREATE FUNCTION idemflow_check(ok boolean, code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        PERFORM idemflow_fail(code, message);
    END IF;
    RETURN true;
END
$$;

-- What \df+ says of idemflow's functions: which an application's SQL may call.
-- idemflow_fence stays callable by the application's role, which runs the
-- engine's statements too; it is documented as internal instead.
COMMENT ON FUNCTION idemflow_fail(text, text) IS
    'idemflow, for application SQL (an engine.AtCommit statement, say): fails the step for good with this code and message. Raises SQLSTATE IF002, DETAIL = code. See docs/sql-guards.md.';
COMMENT ON FUNCTION idemflow_check(boolean, text, text) IS
    'idemflow, for application SQL (an engine.AtCommit statement, say): true when ok is true; otherwise, a NULL ok included, fails the step for good as idemflow_fail(code, message). See docs/sql-guards.md.';
COMMENT ON FUNCTION idemflow_fence(boolean) IS
    'idemflow, internal to the engine, not for application SQL: raises SQLSTATE IF001, which the engine reads as "another run holds the operation". Use idemflow_check.';

---- create above / drop below ----
COMMENT ON FUNCTION idemflow_fence(boolean) IS NULL;
COMMENT ON FUNCTION idemflow_fail(text, text) IS NULL;
DROP FUNCTION idemflow_check(boolean, text, text);
