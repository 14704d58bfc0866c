-- name: StepListByOperation :many
SELECT * FROM idemflow_step WHERE operation_id = @operation_id ORDER BY position;

-- name: StepCheckpoint :execrows
-- Records a step as succeeded. Zero rows means it already was (or was compensated):
-- the caller must roll back whatever it did in the same transaction.
INSERT INTO idemflow_step (operation_id, name, position, state, attempts, output, started_at, finished_at)
VALUES (@operation_id, @name, @position, 'succeeded', @attempts, @output, @started_at,
        coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (operation_id, name) DO UPDATE
SET state = 'succeeded',
    attempts = excluded.attempts,
    output = excluded.output,
    last_error = NULL,
    finished_at = excluded.finished_at
WHERE idemflow_step.state IN ('retrying', 'failed');

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
