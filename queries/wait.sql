-- name: WaitReach :one
-- Records that a run reached a step that waits for a signal, a moment or
-- approvals, and fixes the wait then: until is at, or now plus after (both
-- null: no deadline), by the database's clock, and need the approvals it
-- needs. A step reached before keeps what was fixed then. Returns the wait as
-- fixed, and the database's clock; no row when the step is checkpointed.
-- The clock is read when the statement runs (clock_timestamp), not when its
-- transaction began: after the run's fence, which waits for a signal being
-- sent to commit, so that a deadline and a signal are judged in the order
-- they committed. It is read once: the wait's start and its end are apart by
-- exactly after.
WITH c AS MATERIALIZED (
    SELECT clock_timestamp() AS t
), reached AS (
    INSERT INTO idemflow_step_row (operation_id, name, position, state, attempts, started_at, waiting_since,
                                   wait_reason, wait_signal, wait_until, wait_need)
    SELECT @operation_id, @name, @position, 'waiting', 0, c.t, c.t,
           @wait_reason, sqlc.narg('wait_signal')::text,
           coalesce(sqlc.narg('at')::timestamptz, c.t + sqlc.narg('after')::interval), sqlc.narg('need')::integer
    FROM c
    WHERE NOT EXISTS (
        SELECT 1 FROM idemflow_operation
        WHERE id = @operation_id AND checkpoints -> @name::text IS NOT NULL
    )
    -- A row without a wait (a failed attempt whose transaction rolled the
    -- first reach back recorded it) gets one now.
    ON CONFLICT (operation_id, name) DO UPDATE
    SET wait_reason = excluded.wait_reason, wait_signal = excluded.wait_signal,
        wait_until = excluded.wait_until, wait_need = excluded.wait_need,
        waiting_since = coalesce(idemflow_step_row.waiting_since, excluded.waiting_since)
    WHERE idemflow_step_row.wait_reason IS NULL
    RETURNING wait_until, wait_need, waiting_since
)
SELECT r.wait_until, r.wait_need, r.waiting_since, true AS reached_now, c.t::timestamptz AS now FROM reached AS r, c
UNION ALL
SELECT s.wait_until, s.wait_need, coalesce(s.waiting_since, s.started_at), false, c.t::timestamptz
FROM idemflow_step_row AS s, c
WHERE s.operation_id = @operation_id AND s.name = @name AND NOT EXISTS (SELECT 1 FROM reached);

-- name: SignalInsert :one
-- Keeps a signal to an operation, once per signal_id. No row: it is there
-- already (SignalGet tells whether it is the same).
INSERT INTO idemflow_signal (operation_id, signal_id, name, payload, actor, reason)
VALUES (@operation_id, @signal_id, @name, sqlc.narg('payload')::jsonb, @actor, @reason)
ON CONFLICT (operation_id, signal_id) DO NOTHING
RETURNING received_at;

-- name: SignalGet :one
SELECT * FROM idemflow_signal WHERE operation_id = @operation_id AND signal_id = @signal_id;

-- name: SignalList :many
-- The signals of the given names sent to an operation, in the order they
-- were received.
SELECT * FROM idemflow_signal
WHERE operation_id = @operation_id AND name = ANY (sqlc.arg(names)::text[])
ORDER BY received_at, signal_id;

-- name: WaitStepFor :many
-- The steps of an operation that wait for the signal named wait_signal, or
-- have waited for it, with whether their deadline has passed by the
-- database's clock when the statement runs (after the caller locked the
-- operation's row), not when its transaction began.
SELECT name, state, wait_until, wait_need,
       (wait_until IS NOT NULL AND wait_until <= clock_timestamp())::boolean AS expired
FROM idemflow_step_row
WHERE operation_id = @operation_id AND wait_signal = @wait_signal
ORDER BY position;

-- name: OperationReleaseWait :one
-- Hands back the operation that run_id holds while a step waits for a signal
-- or a moment, with no process busy on it: due again at wake_at (the timer
-- loops take it then; the sweeper a lease after it, should none), or, with no
-- wake_at, only when a signal wakes it (OperationWake): its lease is then a
-- century, which a wake shortens to now. No row: run_id no longer holds it.
UPDATE idemflow_operation
SET locked_by = NULL,
    parked = false,
    wake_at = sqlc.narg('wake_at')::timestamptz,
    locked_until = coalesce(sqlc.narg('wake_at')::timestamptz + sqlc.arg(lease)::interval, now() + interval '100 years')
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress'
RETURNING id;

-- name: OperationNextWake :one
-- The earliest wake_at of the operations of the definitions given that wait
-- with no process busy on them (found false: none), and the database's
-- clock: one probe of idemflow_operation_wake, however many wait.
SELECT coalesce(w.wake_at, now())::timestamptz AS wake_at, (w.wake_at IS NOT NULL)::boolean AS found, now()::timestamptz AS now
FROM (SELECT min(o.wake_at) AS wake_at FROM idemflow_operation AS o
      WHERE o.wake_at IS NOT NULL AND o.state = 'in_progress' AND NOT o.parked AND o.locked_by IS NULL
        AND o.name || '@' || o.version = ANY (sqlc.arg(definitions)::text[])) AS w;

-- name: OperationListDue :many
-- Operations of the definitions given whose wake_at has come, earliest first.
SELECT o.id, o.name, o.scope FROM idemflow_operation AS o
WHERE o.wake_at <= now() AND o.state = 'in_progress' AND NOT o.parked AND o.locked_by IS NULL
  AND o.name || '@' || o.version = ANY (sqlc.arg(definitions)::text[])
ORDER BY o.wake_at
LIMIT sqlc.arg(max)::int;

-- name: OperationTakeDue :execrows
-- Takes an operation whose wake_at has come for a resume job queued in the
-- same transaction; no row: another process took it, or it was woken.
UPDATE idemflow_operation
SET wake_at = NULL,
    locked_until = now() + @lease::interval
WHERE id = @id AND wake_at <= now() AND state = 'in_progress' AND NOT parked AND locked_by IS NULL;

-- name: ApprovalList :many
-- The operations in progress whose step waits for approvals and is not
-- decided yet (fewer distinct approvals than it needs, and no rejection),
-- oldest first, with the actors who approved each, in the order they did.
SELECT o.id, o.name, o.version, o.scope, o.key, s.name AS step, s.waiting_since, s.wait_until, s.wait_need,
       a.approved_by::text[] AS approved_by
FROM idemflow_step_row AS s
JOIN idemflow_operation AS o ON o.id = s.operation_id
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(g.actor ORDER BY g.received_at, g.signal_id) FILTER (WHERE g.name = 'idemflow.approve'), '{}') AS approved_by,
           count(*) FILTER (WHERE g.name = 'idemflow.reject') AS rejections
    FROM idemflow_signal AS g
    WHERE g.operation_id = o.id AND g.name IN ('idemflow.approve', 'idemflow.reject')
) AS a
WHERE s.state = 'waiting' AND s.wait_reason = 'approval' AND o.state = 'in_progress'
  AND a.rejections = 0 AND cardinality(a.approved_by) < s.wait_need
ORDER BY s.waiting_since, o.id
LIMIT sqlc.arg(max)::int;

-- name: OperationGetByKeyForUpdate :one
SELECT * FROM idemflow_operation WHERE scope = @scope AND key = @key FOR UPDATE;
