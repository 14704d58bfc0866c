-- name: StepListByOperation :many
-- The operation's recorded steps: its rows and its checkpoints.
SELECT operation_id, name, position, state, attempts, output, last_error,
       started_at, finished_at, last_cause, resolved_by, compensations,
       sent_at, pending, waiting_since, settle_by, reference,
       wait_reason, wait_signal, wait_until, wait_need
FROM idemflow_step_recorded WHERE operation_id = @operation_id ORDER BY position;

-- name: StepMaterialize :exec
-- Gives a step kept as a checkpoint in its operation's row a row of its own,
-- which then wins over the checkpoint: what a compensation marks. Nothing when
-- the step has a row already.
INSERT INTO idemflow_step_row (operation_id, name, position, state, attempts, output, started_at, finished_at, resolved_by)
SELECT r.operation_id, r.name, r.position, r.state, r.attempts, r.output, r.started_at, r.finished_at, r.resolved_by
FROM idemflow_step_recorded AS r
WHERE r.operation_id = @operation_id AND r.name = @name
ON CONFLICT (operation_id, name) DO NOTHING;

-- name: StepRecordFailure :exec
-- Records a failed attempt: 'retrying' when another attempt will follow,
-- 'waiting' when the step waits for its outcome (no attempt follows; its
-- lookup, an event or an operator settles it), 'failed' when the step failed
-- for good. 'retrying' and 'waiting' never overwrite 'failed', and nothing
-- overwrites a succeeded or compensated step, nor a checkpoint in the
-- operation's row. sent_at, when given, is when the attempt's request was
-- sent at the latest; a step keeps the last one. waiting_since is kept while
-- the step goes on waiting. The run that writes it is fenced by
-- OperationFence in the same transaction. settle_window, when given, fixes
-- the step's settle_by: the database's clock now (after the request was sent)
-- plus the window; a later request moves it later, never earlier. reference,
-- when given, is the reference of a call the service accepted as pending.
INSERT INTO idemflow_step_row (operation_id, name, position, state, attempts, last_error, last_cause, started_at, finished_at,
                               sent_at, pending, waiting_since, derived_key, settle_by, reference)
SELECT @operation_id, @name, @position, @state, @attempts, @last_error, @last_cause, @started_at,
       CASE WHEN @state::text = 'failed' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
       sqlc.narg('sent_at')::timestamptz, @pending,
       CASE WHEN @state::text = 'waiting' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
       sqlc.narg('derived_key')::text,
       coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) + sqlc.narg('settle_window')::interval,
       sqlc.narg('reference')::text
WHERE NOT EXISTS (
    SELECT 1 FROM idemflow_operation
    WHERE id = @operation_id AND checkpoints -> @name::text IS NOT NULL
)
ON CONFLICT (operation_id, name) DO UPDATE
SET state = excluded.state,
    attempts = excluded.attempts,
    last_error = excluded.last_error,
    last_cause = excluded.last_cause,
    finished_at = excluded.finished_at,
    sent_at = coalesce(excluded.sent_at, idemflow_step_row.sent_at),
    pending = excluded.pending,
    derived_key = coalesce(excluded.derived_key, idemflow_step_row.derived_key),
    settle_by = greatest(excluded.settle_by, idemflow_step_row.settle_by),
    reference = coalesce(excluded.reference, idemflow_step_row.reference),
    waiting_since = CASE
        WHEN excluded.state <> 'waiting' THEN NULL
        WHEN idemflow_step_row.state = 'waiting' THEN idemflow_step_row.waiting_since
        ELSE excluded.waiting_since
    END
WHERE idemflow_step_row.state IN ('retrying', 'waiting')
   OR idemflow_step_row.state = 'failed' AND excluded.state = 'failed';

-- name: StepWaitingByKey :one
-- The waiting step whose derived key is derived_key.
SELECT operation_id, name FROM idemflow_step_row
WHERE derived_key = @derived_key AND state = 'waiting';

-- name: StepCompensated :execrows
UPDATE idemflow_step_row
SET state = 'compensated', finished_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE operation_id = @operation_id AND name = @name AND state = 'succeeded';

-- name: StepDeleteUnsucceeded :exec
-- Forgets the failed and compensated steps of a reopened operation, rows and
-- checkpoints, so that they run again; succeeded steps stay done.
WITH gone AS (
    DELETE FROM idemflow_step_row WHERE operation_id = @operation_id AND state <> 'succeeded'
    RETURNING name
)
UPDATE idemflow_operation
SET checkpoints = checkpoints - ARRAY(SELECT name FROM gone)
WHERE id = @operation_id AND checkpoints IS NOT NULL;

-- name: StepUpdateSucceeded :exec
-- Records steps that succeeded after failed attempts, whose rows say
-- 'retrying' or 'waiting'. It raises SQLSTATE IF001 when a row says anything else, aborting
-- the transaction: another run recorded the step first, as succeeded, or as
-- failed for good (an operator's retry deletes failed rows first).
WITH u AS (
    SELECT unnest(sqlc.arg(names)::text[]) AS name,
           unnest(sqlc.arg(attempts)::integer[]) AS attempts,
           unnest(sqlc.arg(outputs)::text[])::json AS output,
           nullif(unnest(sqlc.arg(resolved_bys)::text[]), '') AS resolved_by
), upd AS (
    UPDATE idemflow_step_row AS s
    SET state = 'succeeded',
        attempts = u.attempts,
        output = u.output,
        resolved_by = u.resolved_by,
        last_error = NULL,
        last_cause = NULL,
        pending = false,
        waiting_since = NULL,
        finished_at = coalesce(sqlc.narg(now)::timestamptz, now())
    FROM u
    WHERE s.operation_id = sqlc.arg(operation_id)::uuid
      AND s.name = u.name
      AND s.state IN ('retrying', 'waiting')
    RETURNING 1
)
SELECT idemflow_fence((SELECT count(*) FROM upd) = cardinality(sqlc.arg(names)::text[]));

-- name: StepCompensationFailed :exec
-- Records a failed attempt of a succeeded step's compensation: how many have
-- failed, and the last one's texts. The transaction's OperationFence fences it.
UPDATE idemflow_step_row
SET compensations = @compensations, last_error = @last_error, last_cause = @last_cause
WHERE operation_id = @operation_id AND name = @name AND state = 'succeeded';

-- name: StepResetSucceeded :exec
-- Clears what a reopened operation's succeeded steps kept of their
-- compensations' failures, so that a compensation gets its attempts again.
UPDATE idemflow_step_row
SET compensations = 0, last_error = NULL, last_cause = NULL
WHERE operation_id = @operation_id AND state = 'succeeded' AND compensations > 0;
