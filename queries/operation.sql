-- name: OperationInsert :one
-- The lease counts from the statement, not from the start of the caller's
-- transaction, which may have begun long before.
-- Without locked_by, its runs start at 0: the River job's claim counts the first.
INSERT INTO idemflow_operation (id, name, version, scope, key, steps, input, fingerprint, key_seed, locked_by, locked_until, created_at, runs, format, settle_window)
VALUES (@id, @name, @version, @scope, @key, sqlc.arg('steps')::text[], @input, sqlc.narg('fingerprint'), @key_secret, sqlc.narg('locked_by'), coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) + @lease::interval, coalesce(sqlc.narg('now')::timestamptz, now()),
        CASE WHEN sqlc.narg('locked_by')::uuid IS NULL THEN 0 ELSE 1 END, 2, sqlc.narg('settle_window')::interval)
ON CONFLICT (scope, key) DO NOTHING
RETURNING created_at;

-- name: OperationReserve :exec
-- Reserves (scope, key) for an operation that this run executes at once. A taken
-- key is an error (unique_violation on idemflow_operation_scope_key) rather than
-- no row, so that what the engine sends in the same round trip after it does not
-- run. OperationInsert is the variant for a caller's own transaction.
-- The lease counts from the statement (clock_timestamp), not from the start of
-- its transaction. checkpoints are those of the steps that its transaction
-- carries, sent with it when the transaction sends nothing before its commit.
INSERT INTO idemflow_operation (id, name, version, scope, key, steps, input, fingerprint, key_seed, locked_by, locked_until, checkpoints, format, settle_window)
VALUES (@id, @name, @version, @scope, @key, sqlc.arg('steps')::text[], @input, sqlc.narg('fingerprint'), @key_secret, @locked_by, clock_timestamp() + @lease::interval,
        sqlc.narg('checkpoints')::jsonb, 2, sqlc.narg('settle_window')::interval);

-- name: OperationCheckpoint :exec
-- Adds checkpoints (an object by step name, see store migration 00010) to the
-- operation. It raises SQLSTATE IF001, aborting the transaction, when one of
-- names (the checkpoints' steps) is recorded already: another run recorded
-- it first. Else it is no fence: the transaction that sends it is fenced by
-- its reservation or OperationFence, and may have released the lease before
-- it (the checkpoints go with COMMIT, after a park or a hand-off).
WITH cp AS (
    UPDATE idemflow_operation
    SET checkpoints = coalesce(checkpoints, '{}'::jsonb) || sqlc.arg(checkpoints)::jsonb
    WHERE id = sqlc.arg(id)::uuid
      AND NOT coalesce(jsonb_exists_any(checkpoints, sqlc.arg(names)::text[]), false)
    RETURNING 1
)
SELECT idemflow_fence(EXISTS (SELECT 1 FROM cp));

-- name: OperationGetByKey :one
SELECT * FROM idemflow_operation WHERE scope = @scope AND key = @key;

-- name: OperationGet :one
SELECT * FROM idemflow_operation WHERE id = @id;

-- name: OperationClaim :one
-- Takes the operation for a run when nobody holds it: it waits for a job
-- (locked_by is null) or its holder's lease has expired. A parked operation is
-- taken only with parked: an operator's cancel. Only an operation of one of
-- versions is taken: the definitions that the claiming process runs.
-- settle_window grows to the claiming process's longest window: a request its
-- run sends may land that long after calls_until.
UPDATE idemflow_operation
SET locked_by = @run_id,
    locked_until = coalesce(sqlc.narg('now')::timestamptz, now()) + @lease::interval,
    runs = runs + 1,
    settle_window = greatest(settle_window, sqlc.narg('settle_window')::interval),
    wake_at = NULL
WHERE id = @id
  AND state = 'in_progress'
  AND version = ANY (sqlc.arg(versions)::integer[])
  AND (locked_by IS NULL OR locked_until < coalesce(sqlc.narg('now')::timestamptz, now()))
  AND (NOT parked OR sqlc.arg(parked)::boolean)
RETURNING *;

-- name: OperationRenewLease :execrows
UPDATE idemflow_operation
SET locked_until = coalesce(sqlc.narg('now')::timestamptz, now()) + @lease::interval
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationRelease :one
-- Hands the operation to a River job scheduled delay from now, by the
-- database's clock, and returns that time; the sweeper looks again only if
-- nothing has claimed it a lease after that. No row: run_id no longer holds it.
-- A parked operation that an operator cancels is unparked, so that the job
-- goes on with its compensations. interrupted says that the run stopped in the
-- middle of its work, maybe of a call out: calls_until records when.
UPDATE idemflow_operation
SET locked_by = NULL,
    parked = false,
    locked_until = now() + sqlc.arg(delay)::interval + sqlc.arg(lease)::interval,
    calls_until = CASE WHEN sqlc.arg(interrupted)::boolean THEN now() ELSE calls_until END
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress'
RETURNING (now() + sqlc.arg(delay)::interval)::timestamptz AS run_at;

-- name: OperationGiveBack :execrows
-- Hands back an operation that run_id claimed and did nothing with, left
-- alone until what it was before (or now, if that has passed): the sweeper
-- takes it up then, not at once.
UPDATE idemflow_operation
SET locked_by = NULL,
    locked_until = greatest(@locked_until::timestamptz, now())
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationFence :exec
-- Raises SQLSTATE IF001, aborting the transaction, unless run_id holds the
-- operation in progress, and keeps it so until the transaction ends: the row
-- lock (FOR SHARE) makes a claim by another run wait for this commit, after
-- which that run reads what this one recorded.
SELECT idemflow_fence(EXISTS (
    SELECT 1 FROM idemflow_operation
    WHERE id = @id AND locked_by = @run_id AND state = 'in_progress'
    FOR SHARE
));

-- name: OperationPark :execrows
-- Parks the operation that run_id holds: no run takes it up again (the sweeper
-- skips it, a resume job does not claim it) until an operator reopens or
-- cancels it. attention says why.
UPDATE idemflow_operation
SET locked_by = NULL,
    parked = true,
    attention_code = @attention_code,
    attention = @attention
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationSetAttention :execrows
-- Marks the operation that run_id holds as needing an operator, for a reason
-- (code and text), while its runs go on.
UPDATE idemflow_operation
SET attention_code = @attention_code,
    attention = @attention
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationListExpired :many
-- Operations in progress of one definition (name, version) whose holder
-- stopped renewing its lease, oldest first: one range of
-- idemflow_operation_unfinished, so operations of other definitions (a version this
-- process does not run) cost nothing however many wait.
SELECT id, name, version, scope FROM idemflow_operation
WHERE name = @name AND version = @version
  AND state = 'in_progress' AND NOT parked
  AND locked_until < coalesce(sqlc.narg('now')::timestamptz, now())
ORDER BY locked_until
LIMIT @max;

-- name: OperationExtendExpired :execrows
-- Pushes an expired lease forward while a resume job is queued, so that the next
-- sweep does not enqueue the same operation again. The lease of a run that
-- held it (and may have been calling out) is kept as calls_until.
UPDATE idemflow_operation
SET locked_by = NULL,
    locked_until = coalesce(sqlc.narg('now')::timestamptz, now()) + @lease::interval,
    calls_until = CASE WHEN locked_by IS NOT NULL THEN greatest(calls_until, locked_until) ELSE calls_until END
WHERE id = @id
  AND state = 'in_progress' AND NOT parked
  AND locked_until < coalesce(sqlc.narg('now')::timestamptz, now());

-- name: OperationSetError :execrows
-- Records the permanent error of an operation that is still compensating, so that
-- a resumed run finishes it with the same error.
UPDATE idemflow_operation
SET error = @error
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationDeleteExpired :execrows
-- Deletes up to max finished operations (their steps go with them) whose
-- expiry, set when they finished, has passed by the database's clock. Rows
-- that another sweep holds are skipped, not waited for.
DELETE FROM idemflow_operation
WHERE id IN (
    SELECT o.id FROM idemflow_operation o
    WHERE o.state <> 'in_progress'
      AND o.expires_at < coalesce(sqlc.narg('now')::timestamptz, now())
    ORDER BY o.expires_at
    LIMIT sqlc.arg(max)
    FOR UPDATE SKIP LOCKED
);

-- name: OperationDeleteFinished :execrows
-- Deletes up to max finished operations without an expiry (they finished
-- before store migration 00009) that finished longer than retention ago, by
-- the database's clock: of one type when name is given, else of every type but
-- those excluded. Rows that another sweep holds are skipped, not waited for.
DELETE FROM idemflow_operation
WHERE id IN (
    SELECT o.id FROM idemflow_operation o
    WHERE o.state <> 'in_progress'
      AND o.expires_at IS NULL
      AND o.finished_at < coalesce(sqlc.narg('now')::timestamptz, now()) - sqlc.arg(retention)::interval
      AND (sqlc.narg(name)::text IS NULL OR o.name = sqlc.narg(name)::text)
      AND NOT (o.name = ANY (sqlc.arg(exclude)::text[]))
    LIMIT sqlc.arg(max)
    FOR UPDATE SKIP LOCKED
);

-- name: OperationGetForUpdate :one
-- The operation, locked until the transaction ends: an operator's retry
-- decides on what it reads, and nothing may change it meanwhile.
SELECT * FROM idemflow_operation WHERE id = @id FOR UPDATE;

-- name: OperationReopen :execrows
-- Gives a failed or parked operation that no live run holds (a cancel may
-- hold a parked one) back to the runs, for an operator's retry. With keep_error, a parked operation that was compensating keeps its
-- error, so that its next run goes on with the compensations. With
-- keep_answer, a failed operation's error is kept as its prior answer, which
-- its key replays until it finishes again.
UPDATE idemflow_operation
SET state = 'in_progress', result = NULL,
    error = CASE WHEN sqlc.arg(keep_error)::boolean THEN error END,
    prior_error = CASE WHEN sqlc.arg(keep_answer)::boolean THEN error END,
    finished_at = NULL, expires_at = NULL,
    attention_code = NULL, attention = NULL, parked = false,
    locked_by = NULL, locked_until = now() + sqlc.arg(lease)::interval
WHERE id = sqlc.arg(id)
  AND (state = 'failed' OR state = 'in_progress' AND parked)
  AND (locked_by IS NULL OR locked_until < now());

-- name: OperationList :many
-- Operations newest first, for operators, with optional filters: a state, a
-- name, a scope, created before a time, needing attention; after, when set,
-- pages on from the operation (created_at, id) of the previous page's last.
-- mismatched: a reconciliation mismatch names the operation (which needs
-- attention then, finished or not).
-- version_waiting: the operation is in progress on a version that no live
-- process runs, while one runs another version of its name (a deploy moved
-- on without it).
SELECT sqlc.embed(o),
       EXISTS (SELECT 1 FROM idemflow_mismatch AS m WHERE m.operation_id = o.id) AS mismatched,
       coalesce(o.state = 'in_progress' AND w.waits, false)::boolean AS version_waiting
FROM idemflow_operation AS o
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM idemflow_process AS p, unnest(p.definitions) AS d
                   WHERE p.seen_at + 3 * p.lease >= now() AND left(d, length(o.name) + 1) = o.name || '@')
       AND NOT EXISTS (SELECT 1 FROM idemflow_process AS p
                       WHERE p.seen_at + 3 * p.lease >= now() AND o.name || '@' || o.version = ANY (p.definitions)) AS waits
) AS w
WHERE (sqlc.narg(state)::text IS NULL OR o.state = sqlc.narg(state)::text)
  AND (sqlc.narg(name)::text IS NULL OR o.name = sqlc.narg(name)::text)
  AND (sqlc.narg(scope)::text IS NULL OR o.scope = sqlc.narg(scope)::text)
  AND (sqlc.narg(created_before)::timestamptz IS NULL OR o.created_at < sqlc.narg(created_before)::timestamptz)
  AND (NOT sqlc.arg(needs_attention)::boolean
       OR (o.state = 'in_progress' AND o.attention_code IS NOT NULL)
       OR EXISTS (SELECT 1 FROM idemflow_mismatch AS m WHERE m.operation_id = o.id)
       OR (o.state = 'in_progress' AND w.waits))
  AND (sqlc.narg(after_created)::timestamptz IS NULL
       OR (o.created_at, o.id) < (sqlc.narg(after_created)::timestamptz, sqlc.narg(after_id)::uuid))
ORDER BY o.created_at DESC, o.id DESC
LIMIT sqlc.arg(max);

-- name: OperationFinish :exec
-- Ends an operation with its result or error, fenced by the run that holds it,
-- and adds the checkpoints of the steps that succeeded at their first
-- recorded attempt in its last transaction (an object by step name, see store
-- migration 00010; null when none; names are their steps). It raises SQLSTATE
-- IF001, aborting the transaction, when run_id no longer holds the operation
-- in progress, or one of names is recorded already. Its row
-- carries the operation's created_at and finished_at, for the Info of a run
-- that finished it. Its key may be deleted once retention has passed.
WITH fin AS (
    UPDATE idemflow_operation
    SET state = sqlc.arg(state)::text,
        result = sqlc.narg(result)::json,
        error = sqlc.narg(error)::jsonb,
        -- A succeeded operation never runs again: the checkpoints it adds
        -- keep no state (stripping the ones it has would cost more than the
        -- bytes it saves).
        checkpoints = CASE WHEN sqlc.narg(checkpoints)::jsonb IS NULL THEN checkpoints
                           ELSE coalesce(checkpoints, '{}'::jsonb) || sqlc.narg(checkpoints)::jsonb END,
        attention_code = NULL,
        attention = NULL,
        parked = false,
        locked_by = NULL,
        prior_error = NULL,
        finished_at = coalesce(sqlc.narg(now)::timestamptz, now()),
        expires_at = coalesce(sqlc.narg(now)::timestamptz, now()) + sqlc.arg(retention)::interval
    WHERE id = sqlc.arg(operation_id)::uuid
      AND locked_by = sqlc.arg(run_id)::uuid
      AND state = 'in_progress'
      AND NOT coalesce(jsonb_exists_any(checkpoints, sqlc.arg(names)::text[]), false)
    RETURNING id, created_at, finished_at
)
SELECT idemflow_fence(EXISTS (SELECT 1 FROM fin)),
       (SELECT created_at FROM fin), (SELECT finished_at FROM fin);

-- name: OperationListUnfinishedForCheck :many
-- Every unfinished operation with its definition's name and version, its step
-- list, whether it is failing (compensating), and its succeeded and compensated
-- steps: what the pre-deploy check needs to tell whether a set of definitions
-- could run it. Not for the request path: it reads every unfinished operation.
SELECT o.id, o.name, o.version, o.steps, (o.error IS NOT NULL)::boolean AS failing,
       coalesce(array_agg(s.name) FILTER (WHERE s.state = 'succeeded'), '{}')::text[] AS succeeded,
       coalesce(array_agg(s.name) FILTER (WHERE s.state = 'compensated'), '{}')::text[] AS compensated
FROM idemflow_operation AS o
LEFT JOIN idemflow_step_recorded AS s ON s.operation_id = o.id
WHERE o.state = 'in_progress'
GROUP BY o.id
ORDER BY o.created_at, o.id;

-- name: OperationListOtherVersions :many
-- Up to max operations in progress of name whose version is none of versions
-- and whose lease expired: what a process that lacks their version logs, once
-- each, that it leaves alone. Read only, once a lease, and in no order, so
-- that it stops at the first max it finds in idemflow_operation_unfinished.
SELECT id, version FROM idemflow_operation
WHERE name = @name AND NOT (version = ANY (sqlc.arg(versions)::integer[]))
  AND state = 'in_progress' AND NOT parked
  AND locked_until < now()
LIMIT @max;

-- name: OperationInProgressStats :many
-- Per operation type and version, the operations in progress, how many of
-- them need attention (as Info.NeedsAttention has it), how many wait with no
-- process busy on them, by reason, and the age of the
-- oldest, by the database's clock: a scan of idemflow_operation_unfinished,
-- which reads the rows of unfinished operations only, and a probe of each
-- one's step rows.
SELECT o.name, o.version, count(*)::bigint AS in_progress,
       count(*) FILTER (WHERE o.attention_code IS NOT NULL OR w.waits
                        OR EXISTS (SELECT 1 FROM idemflow_mismatch AS m WHERE m.operation_id = o.id))::bigint AS needing_attention,
       count(*) FILTER (WHERE wr.reason = 'outcome')::bigint AS waiting_outcome,
       count(*) FILTER (WHERE wr.reason = 'signal')::bigint AS waiting_signal,
       count(*) FILTER (WHERE wr.reason = 'timer')::bigint AS waiting_timer,
       count(*) FILTER (WHERE wr.reason = 'approval')::bigint AS waiting_approval,
       extract(epoch FROM now() - min(o.created_at))::float8 AS oldest_seconds
FROM idemflow_operation AS o
-- As OperationList's version_waiting: no live process runs the version, one
-- runs another version of the name.
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM idemflow_process AS p, unnest(p.definitions) AS d
                   WHERE p.seen_at + 3 * p.lease >= now() AND left(d, length(o.name) + 1) = o.name || '@')
       AND NOT EXISTS (SELECT 1 FROM idemflow_process AS p
                       WHERE p.seen_at + 3 * p.lease >= now() AND o.name || '@' || o.version = ANY (p.definitions)) AS waits
) AS w
-- Why it waits with no process busy on it, when it does: an external step
-- waits for its outcome (wait_reason null), or a step for a signal, a moment
-- or approvals.
LEFT JOIN LATERAL (
    SELECT coalesce(s.wait_reason, 'outcome') AS reason FROM idemflow_step_row AS s
    WHERE s.operation_id = o.id AND s.state = 'waiting'
    LIMIT 1
) AS wr ON true
WHERE o.state = 'in_progress'
GROUP BY o.name, o.version
ORDER BY name, version;

-- name: OperationWake :execrows
-- Makes an operation in progress whose waiting step has something new to
-- read (an outcome in the inbox, an operator's retry) due at once, for the
-- resume job inserted with it (or the sweeper): unless a live run holds it,
-- whose lease stands. Its attention is cleared (the next run marks it again
-- if it must); a parked operation stays parked, with its attention.
UPDATE idemflow_operation
SET locked_until = CASE WHEN locked_by IS NULL OR locked_until < coalesce(sqlc.narg('now')::timestamptz, now())
                        THEN least(locked_until, coalesce(sqlc.narg('now')::timestamptz, now()))
                        ELSE locked_until END,
    attention_code = CASE WHEN parked THEN attention_code END,
    attention = CASE WHEN parked THEN attention END
WHERE id = @id AND state = 'in_progress';

-- name: OperationHeld :one
-- Whether a live run holds the operation (its lease has not run out by the
-- database's clock).
SELECT (locked_by IS NOT NULL AND locked_until >= coalesce(sqlc.narg('now')::timestamptz, now()))::boolean AS held
FROM idemflow_operation WHERE id = @id;

-- name: OperationUnpark :execrows
-- Unparks the operation that run_id holds and clears why it needed attention:
-- an operator has decided, and the run goes on from there.
UPDATE idemflow_operation
SET parked = false, attention_code = NULL, attention = NULL
WHERE id = @id AND locked_by = @run_id AND state = 'in_progress';

-- name: OperationListOrphaned :many
-- Operations in progress of the definitions given whose lease a run of a dead
-- process holds: the run's id starts with its process's liveness key (a
-- session advisory lock in the namespace given, which PostgreSQL releases when
-- the session ends), and no session of this database holds that lock any
-- more. A run of a process without one (key 0) is left to its lease.
WITH live AS MATERIALIZED (
    SELECT k AS key FROM idemflow_live_keys(sqlc.arg(namespace)::bigint) AS k
)
SELECT o.id, o.name, o.scope, o.locked_by::uuid AS run_id
FROM idemflow_operation AS o
WHERE o.state = 'in_progress' AND NOT o.parked
  AND o.name || '@' || o.version = ANY (sqlc.arg(definitions)::text[])
  AND o.locked_by IS NOT NULL AND o.locked_until >= now()
  AND left(o.locked_by::text, 8) <> '00000000'
  AND NOT EXISTS (
      SELECT 1 FROM live
      WHERE live.key = ('x' || left(o.locked_by::text, 8))::bit(32)::integer::bigint
  )
LIMIT sqlc.arg(max)::int;

-- name: OperationTakeOver :execrows
-- Takes an operation from the dead run that holds it, for a resume job queued
-- in the same transaction, as OperationExtendExpired does for an expired
-- lease: the dead run may have been calling out until now.
UPDATE idemflow_operation
SET locked_by = NULL,
    locked_until = now() + @lease::interval,
    calls_until = greatest(calls_until, now())
WHERE id = @id AND locked_by = @run_id
  AND state = 'in_progress' AND NOT parked;
