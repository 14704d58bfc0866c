-- Liveness: each process with workers holds a session advisory lock (in the
-- namespace the engine names) for as long as it lives, and its runs' ids start
-- with the lock's key. PostgreSQL releases the lock the moment the session
-- ends, so a run whose key no session holds belongs to a dead process, whose
-- operations may be taken over at once rather than when their lease ends.
--
-- idemflow_live_keys lists the keys of the namespace that sessions of this
-- database hold. pg_locks is read once per call (it takes the lock manager's
-- partition locks briefly, in shared mode).
CREATE FUNCTION idemflow_live_keys(namespace bigint) RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT l.objid::bigint
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.classid::bigint = namespace
      AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
$$;

---- create above / drop below ----

DROP FUNCTION idemflow_live_keys(bigint);
