-- The ids are text, cast here: every pgx query mode encodes a text array.

-- name: ReconcileOperations :many
-- The operations that a page of records names by their keys' ids: what a
-- record is matched against, with the steps checkpointed in the row (store
-- migration 00010: succeeded, unless a step row overrides them), each with the
-- reference it recorded ("f", '' when none), how it was resolved ("r") and
-- when it succeeded (microseconds since 1970 UTC), in one order: one pass
-- over the checkpoints.
SELECT o.id, o.name, o.version, o.scope, o.key, o.state, o.steps, o.input, o.key_seed, o.created_at,
       coalesce(c.names, '{}')::text[] AS checkpointed, coalesce(c.refs, '{}')::text[] AS checkpoint_refs,
       coalesce(c.bys, '{}')::text[] AS checkpoint_resolved_by, coalesce(c.done, '{}')::bigint[] AS checkpoint_done
FROM idemflow_operation AS o
LEFT JOIN LATERAL (
    SELECT array_agg(e.key) AS names, array_agg(coalesce(e.value ->> 'f', '')) AS refs,
           array_agg(coalesce(e.value ->> 'r', '')) AS bys,
           array_agg((e.value ->> 's')::bigint + (e.value ->> 'd')::bigint) AS done
    FROM jsonb_each(o.checkpoints) AS e
) AS c ON true
WHERE o.id = ANY (sqlc.arg(ids)::text[]::uuid[]);

-- name: ReconcileBooks :many
-- A page of the finished operations of the types names created from
-- created_from, by id after after: the books whose succeeded steps a run
-- checks for a record. Operation ids are UUIDv7, so the window is a range of
-- the primary key from the first page's after; created_at, on the
-- database's clock, is what decides. Their checkpoints as ReconcileOperations
-- reads them.
SELECT o.id, o.name, o.version, o.scope, o.key, o.state, o.key_seed, o.created_at,
       coalesce(c.names, '{}')::text[] AS checkpointed, coalesce(c.refs, '{}')::text[] AS checkpoint_refs,
       coalesce(c.bys, '{}')::text[] AS checkpoint_resolved_by, coalesce(c.done, '{}')::bigint[] AS checkpoint_done
FROM idemflow_operation AS o
LEFT JOIN LATERAL (
    SELECT array_agg(e.key) AS names, array_agg(coalesce(e.value ->> 'f', '')) AS refs,
           array_agg(coalesce(e.value ->> 'r', '')) AS bys,
           array_agg((e.value ->> 's')::bigint + (e.value ->> 'd')::bigint) AS done
    FROM jsonb_each(o.checkpoints) AS e
) AS c ON true
WHERE o.id > sqlc.arg(after)::uuid
  AND o.created_at >= sqlc.arg(created_from)::timestamptz
  AND o.state <> 'in_progress'
  AND o.name = ANY (sqlc.arg(names)::text[])
ORDER BY o.id
LIMIT sqlc.arg(max)::int;

-- name: ReconcileSteps :many
-- The step rows named names of the operations ids, with the state after the
-- step (output) and when it ended: key lookups in the step
-- rows' primary key, not the view idemflow_step_recorded, which would read
-- the operations again and could not take the ids into its NOT EXISTS.
-- Joined to the ids, not "operation_id = ANY": planned custom (without a
-- prepared statement, as behind PgBouncer) that would scan every step row.
SELECT s.operation_id, s.name, s.state, s.resolved_by, s.output, s.finished_at
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
-- key, reference, kind) in a call. A mismatch seen again keeps its
-- first_seen.
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
ON CONFLICT (source, record_key, reference, kind) DO UPDATE
SET amount = excluded.amount,
    record_status = excluded.record_status, record_created_at = excluded.record_created_at,
    data = excluded.data, operation_id = excluded.operation_id, step = excluded.step,
    detail = excluded.detail, last_seen = excluded.last_seen;

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
-- The mismatches of a source ('' for every source), of an operation when
-- operation_id is not null, oldest first, with their operations as they are
-- now: a page of max after the mismatch (after_first_seen, after_source,
-- after_record_key, after_reference, after_kind) when after_first_seen is not
-- null.
SELECT m.source, m.record_key, m.kind, m.reference, m.amount, m.record_status, m.record_created_at,
       m.data, m.operation_id, m.step, m.detail, m.first_seen, m.last_seen,
       o.name AS operation_name, o.scope AS operation_scope, o.state AS operation_state
FROM idemflow_mismatch AS m
LEFT JOIN idemflow_operation AS o ON o.id = m.operation_id
WHERE (sqlc.arg(source)::text = '' OR m.source = sqlc.arg(source)::text)
  AND (sqlc.narg(operation_id)::uuid IS NULL OR m.operation_id = sqlc.narg(operation_id)::uuid)
  AND (sqlc.narg(after_first_seen)::timestamptz IS NULL
       OR (m.first_seen, m.source, m.record_key, m.reference, m.kind)
          > (sqlc.narg(after_first_seen)::timestamptz, sqlc.arg(after_source)::text, sqlc.arg(after_record_key)::text,
             sqlc.arg(after_reference)::text, sqlc.arg(after_kind)::text))
ORDER BY m.first_seen, m.source, m.record_key, m.reference, m.kind
LIMIT sqlc.arg(max)::int;

-- name: MismatchCount :one
-- How many mismatches a source has ('' for every source), of an operation
-- when operation_id is not null.
SELECT count(*)::bigint
FROM idemflow_mismatch AS m
WHERE (sqlc.arg(source)::text = '' OR m.source = sqlc.arg(source)::text)
  AND (sqlc.narg(operation_id)::uuid IS NULL OR m.operation_id = sqlc.narg(operation_id)::uuid);

-- name: MismatchCounts :many
-- How many mismatches there are of each kind.
SELECT kind, count(*)::bigint AS count FROM idemflow_mismatch GROUP BY kind ORDER BY kind;

-- name: ReconciliationRunRecord :exec
INSERT INTO idemflow_reconciliation (source, started_at, checked_at, window_start, checked, not_yet, unverifiable, pages,
                                     steps_checked, expired)
VALUES (@source, @started_at, clock_timestamp(), @window_start, @checked, @not_yet, @unverifiable, @pages,
        @steps_checked, @expired)
ON CONFLICT (source) DO UPDATE
SET started_at = excluded.started_at, checked_at = excluded.checked_at, window_start = excluded.window_start,
    checked = excluded.checked, not_yet = excluded.not_yet, unverifiable = excluded.unverifiable, pages = excluded.pages,
    steps_checked = excluded.steps_checked, expired = excluded.expired
WHERE idemflow_reconciliation.started_at <= excluded.started_at;

-- name: ReconciliationRunGet :one
SELECT * FROM idemflow_reconciliation WHERE source = @source;

-- name: ReconcileNow :one
-- The database's clock, which a run's start is read on: mismatches' last
-- sightings are too.
SELECT clock_timestamp()::timestamptz AS now;
