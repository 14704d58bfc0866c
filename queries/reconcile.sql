-- The ids are text, cast here: every pgx query mode encodes a text array.

-- name: ReconcileOperations :many
-- The operations that a page of records names by their keys' ids: what a
-- record is matched against, with the names of the steps checkpointed in the
-- row (store migration 00010: succeeded, unless a step row overrides them).
SELECT id, name, version, scope, key, state, steps, input, key_seed,
       coalesce(ARRAY(SELECT jsonb_object_keys(checkpoints)), '{}')::text[] AS checkpointed
FROM idemflow_operation
WHERE id = ANY (sqlc.arg(ids)::text[]::uuid[]);

-- name: ReconcileSteps :many
-- The step rows named names of the operations ids: key lookups in the step
-- rows' primary key, not the view idemflow_step_recorded, which would read
-- the operations again and could not take the ids into its NOT EXISTS.
-- Joined to the ids, not "operation_id = ANY": planned custom (without a
-- prepared statement, as behind PgBouncer) that would scan every step row.
SELECT s.operation_id, s.name, s.state, s.resolved_by
FROM unnest(sqlc.arg(ids)::text[]::uuid[]) AS i (id)
JOIN idemflow_step_row AS s ON s.operation_id = i.id
WHERE s.name = ANY (sqlc.arg(names)::text[]);

-- name: ReconcileOperatorReferences :many
-- The references that operators gave, resolving the operations ids' steps as
-- made (the last one per operation wins).
SELECT DISTINCT ON (operation_id) operation_id, reference
FROM idemflow_operator_request
WHERE operation_id = ANY (sqlc.arg(ids)::text[]::uuid[])
  AND action = 'resolve' AND made AND outcome = 'done'
ORDER BY operation_id, id DESC;

-- name: MismatchUpsert :exec
-- Records the mismatches found, or sees them again: at most one per (record
-- key, reference) in a call.
INSERT INTO idemflow_mismatch (source, record_key, kind, reference, amount, record_status,
                               record_created_at, data, operation_id, step, detail, first_seen, last_seen)
SELECT sqlc.arg(source)::text, m.record_key, m.kind, m.reference, m.amount, m.record_status,
       m.record_created_at, m.data, nullif(m.operation_id, '')::uuid, nullif(m.step, ''), m.detail,
       clock_timestamp(), clock_timestamp()
FROM (SELECT unnest(sqlc.arg(record_keys)::text[]) AS record_key, unnest(sqlc.arg(kinds)::text[]) AS kind,
             unnest(sqlc.arg(refs)::text[]) AS reference, unnest(sqlc.arg(amounts)::bigint[]) AS amount,
             unnest(sqlc.arg(record_statuses)::text[]) AS record_status,
             unnest(sqlc.arg(record_created_ats)::timestamptz[]) AS record_created_at,
             unnest(sqlc.arg(data)::jsonb[]) AS data, unnest(sqlc.arg(operation_ids)::text[]) AS operation_id,
             unnest(sqlc.arg(steps)::text[]) AS step, unnest(sqlc.arg(details)::text[]) AS detail) AS m
ON CONFLICT (source, record_key, reference) DO UPDATE
SET kind = excluded.kind, amount = excluded.amount,
    record_status = excluded.record_status, record_created_at = excluded.record_created_at,
    data = excluded.data, operation_id = excluded.operation_id, step = excluded.step,
    detail = excluded.detail, last_seen = excluded.last_seen,
    first_seen = CASE WHEN idemflow_mismatch.kind = excluded.kind THEN idemflow_mismatch.first_seen ELSE excluded.first_seen END;

-- name: MismatchTouch :exec
-- Keeps the mismatches of records a run saw but could not judge yet (pending,
-- or their operation in progress) from being cleared as not seen again.
UPDATE idemflow_mismatch SET last_seen = clock_timestamp()
WHERE source = @source AND record_key = ANY (sqlc.arg(record_keys)::text[]);

-- name: MismatchDelete :exec
-- Forgets the mismatches of records that a run judged and found in order.
DELETE FROM idemflow_mismatch
WHERE source = @source AND record_key = ANY (sqlc.arg(record_keys)::text[]);

-- name: MismatchClear :execrows
-- Ends a run: the mismatches it did not see again are gone.
DELETE FROM idemflow_mismatch WHERE source = @source AND last_seen < @started_at;

-- name: MismatchList :many
-- The mismatches of a source ('' for every source), oldest first, with their
-- operations as they are now.
SELECT m.source, m.record_key, m.kind, m.reference, m.amount, m.record_status, m.record_created_at,
       m.data, m.operation_id, m.step, m.detail, m.first_seen, m.last_seen,
       o.name AS operation_name, o.scope AS operation_scope, o.state AS operation_state
FROM idemflow_mismatch AS m
LEFT JOIN idemflow_operation AS o ON o.id = m.operation_id
WHERE (sqlc.arg(source)::text = '' OR m.source = sqlc.arg(source)::text)
  AND (sqlc.narg(operation_id)::uuid IS NULL OR m.operation_id = sqlc.narg(operation_id)::uuid)
ORDER BY m.first_seen, m.source, m.record_key
LIMIT sqlc.arg(max)::int;

-- name: MismatchCounts :many
-- How many mismatches there are of each kind.
SELECT kind, count(*)::bigint AS count FROM idemflow_mismatch GROUP BY kind ORDER BY kind;

-- name: ReconciliationRunRecord :exec
INSERT INTO idemflow_reconciliation (source, started_at, checked_at, window_start, checked, not_yet, unverifiable, pages)
VALUES (@source, @started_at, clock_timestamp(), @window_start, @checked, @not_yet, @unverifiable, @pages)
ON CONFLICT (source) DO UPDATE
SET started_at = excluded.started_at, checked_at = excluded.checked_at, window_start = excluded.window_start,
    checked = excluded.checked, not_yet = excluded.not_yet, unverifiable = excluded.unverifiable, pages = excluded.pages
WHERE idemflow_reconciliation.started_at <= excluded.started_at;

-- name: ReconciliationRunGet :one
SELECT * FROM idemflow_reconciliation WHERE source = @source;

-- name: ReconcileNow :one
-- The database's clock, which a run's start is read on: mismatches' last
-- sightings are too.
SELECT clock_timestamp()::timestamptz AS now;
