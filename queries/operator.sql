-- name: ProcessUpsert :exec
-- Records, or refreshes, a process that runs workers and its definitions.
INSERT INTO idemflow_process (id, host, pid, definitions, lease)
VALUES (@id, @host, @pid, sqlc.arg(definitions)::text[], @lease::interval)
ON CONFLICT (id) DO UPDATE SET seen_at = now();

-- name: ProcessDelete :exec
DELETE FROM idemflow_process WHERE id = @id;

-- name: ProcessListLive :many
-- The processes seen within three of their leases, and forgets the others.
WITH gone AS (
    DELETE FROM idemflow_process WHERE seen_at + 3 * lease < now()
)
SELECT id, host, pid, definitions, lease, started_at, seen_at FROM idemflow_process
WHERE seen_at + 3 * lease >= now()
ORDER BY started_at, id;

-- name: OperatorRequestInsert :one
INSERT INTO idemflow_operator_request (operation_id, action, reason, force, actor, made, reference)
VALUES (@operation_id, @action, @reason, @force, @actor, sqlc.narg('made'), sqlc.narg('reference'))
RETURNING id;

-- name: OperatorRequestGet :one
SELECT * FROM idemflow_operator_request WHERE id = @id;

-- name: OperatorRequestTake :many
-- Takes up to max pending requests for operations of the definitions given
-- ('name@version'), for the process taken_by: ones nobody took, or whose
-- taker has not finished them within lease.
UPDATE idemflow_operator_request AS r
SET taken_by = @taken_by, taken_at = now()
FROM (
    SELECT q.id FROM idemflow_operator_request AS q
    JOIN idemflow_operation AS o ON o.id = q.operation_id
    WHERE q.done_at IS NULL
      AND (q.taken_at IS NULL OR q.taken_at < now() - @lease::interval)
      AND (o.name || '@' || o.version) = ANY (sqlc.arg(definitions)::text[])
    ORDER BY q.id
    LIMIT @max
    FOR UPDATE OF q SKIP LOCKED
) AS t
WHERE r.id = t.id
RETURNING r.id, r.operation_id, r.action, r.reason, r.force, r.actor, r.made, r.reference;

-- name: OperatorRequestRenew :exec
-- Keeps the requests that taken_by took and has not finished taken, so that
-- no other process takes them again meanwhile (a cancel's compensations may
-- take longer than a lease, and the requests taken with it wait for it).
UPDATE idemflow_operator_request
SET taken_at = now()
WHERE id = ANY (sqlc.arg(ids)::bigint[]) AND taken_by = @taken_by AND done_at IS NULL;

-- name: OperatorRequestFinish :exec
UPDATE idemflow_operator_request
SET done_at = now(), outcome = @outcome, message = @message, code = sqlc.narg('code')
WHERE id = @id AND taken_by = @taken_by AND done_at IS NULL;

-- name: OperatorRequestFailUnknown :execrows
-- Ends the pending requests for operations that do not exist.
UPDATE idemflow_operator_request AS r
SET done_at = now(), outcome = 'refused', message = 'no such operation', code = 'not_found'
WHERE r.done_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM idemflow_operation AS o WHERE o.id = r.operation_id);

-- name: OperatorRequestRecord :exec
-- Records an operator's request that was carried out at once (not through a
-- process that takes it): the audit trail's entry, done or refused.
INSERT INTO idemflow_operator_request (operation_id, action, reason, force, actor, made, reference, done_at, outcome, message, code)
VALUES (@operation_id, @action, @reason, @force, @actor, sqlc.narg('made'), sqlc.narg('reference'), now(), @outcome, @message, sqlc.narg('code'));

-- name: OperatorRequestListByOperation :many
-- The operation's audit trail: its operators' requests, oldest first.
SELECT id, action, reason, actor, force, made, reference, requested_at, done_at, outcome, message, code
FROM idemflow_operator_request
WHERE operation_id = @operation_id
ORDER BY id;
