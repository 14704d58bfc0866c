-- name: StepListByOperation :many
SELECT * FROM idemflow_step WHERE operation_id = @operation_id ORDER BY position;

-- name: StepRecordFailure :exec
-- Records a failed attempt: 'retrying' when another attempt will follow, 'failed'
-- when the step failed for good.
INSERT INTO idemflow_step (operation_id, name, position, state, attempts, last_error, started_at, finished_at)
VALUES (@operation_id, @name, @position, @state, @attempts, @last_error, @started_at,
        CASE WHEN @state::text = 'failed' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END)
ON CONFLICT (operation_id, name) DO UPDATE
SET state = excluded.state,
    attempts = excluded.attempts,
    last_error = excluded.last_error,
    finished_at = excluded.finished_at
WHERE idemflow_step.state IN ('retrying', 'failed');

-- name: StepCompensated :execrows
UPDATE idemflow_step
SET state = 'compensated', finished_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE operation_id = @operation_id AND name = @name AND state = 'succeeded';

-- name: StepDeleteUnsucceeded :exec
-- Forgets the failed and compensated steps of a reopened operation, so that they
-- run again; succeeded steps stay done.
DELETE FROM idemflow_step WHERE operation_id = @operation_id AND state <> 'succeeded';

-- name: StepCheckpointMany :exec
-- Records several steps as succeeded and, when finish is set, ends the operation
-- in the same statement: one round trip for what a transaction commits after an
-- external call. The arrays describe one step each: a step whose earlier
-- attempt failed (retried) has a row to update, any other gets a plain INSERT,
-- cheaper than ON CONFLICT. It raises,
-- aborting the transaction, when another run recorded one of the steps first
-- (unique_violation on idemflow_step_pkey, or SQLSTATE IF001 when the row to
-- update is not 'retrying' or 'failed') or no longer lets this run end the
-- operation (IF001): the engine sends COMMIT right behind it.
WITH u AS (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(positions)::integer[]) AS position,
           unnest(sqlc.arg(attempts)::integer[]) AS attempts,
           unnest(sqlc.arg(outputs)::text[])::json AS output,
           unnest(sqlc.arg(started_ats)::timestamptz[]) AS started_at,
           unnest(sqlc.arg(retried)::boolean[]) AS retried
), ins AS (
    INSERT INTO idemflow_step (operation_id, name, position, state, attempts, output, started_at, finished_at)
    SELECT sqlc.arg(operation_id)::uuid, u.name, u.position, 'succeeded', u.attempts, u.output, u.started_at,
           coalesce(sqlc.narg(now)::timestamptz, now())
    FROM u
    WHERE NOT u.retried
    RETURNING 1
), upd AS (
    UPDATE idemflow_step AS s
    SET state = 'succeeded',
        attempts = u.attempts,
        output = u.output,
        last_error = NULL,
        finished_at = coalesce(sqlc.narg(now)::timestamptz, now())
    FROM u
    WHERE u.retried
      AND s.operation_id = sqlc.arg(operation_id)::uuid
      AND s.name = u.name
      AND s.state IN ('retrying', 'failed')
    RETURNING 1
), fin AS (
    UPDATE idemflow_operation
    SET state = sqlc.arg(state)::text,
        result = sqlc.narg(result)::json,
        error = sqlc.narg(error)::jsonb,
        locked_by = NULL,
        finished_at = coalesce(sqlc.narg(now)::timestamptz, now())
    WHERE sqlc.arg(finish)::boolean
      AND id = sqlc.arg(operation_id)::uuid
      AND locked_by = sqlc.arg(run_id)::uuid
      AND state = 'in_progress'
    RETURNING 1
)
SELECT idemflow_fence((SELECT count(*) FROM ins) + (SELECT count(*) FROM upd) = (SELECT count(*) FROM u)
                      AND (NOT sqlc.arg(finish)::boolean OR (SELECT count(*) FROM fin) = 1));
