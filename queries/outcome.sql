-- name: OutcomeLock :exec
-- Serialises the writers of the inbox under derived_key with the transactions
-- that decide that its call was not made (idemflow_refuse_not_made), until
-- the caller's transaction ends.
SELECT idemflow_outcome_lock(@derived_key);

-- name: OutcomeInsert :one
-- Keeps what the outside service said of the call under derived_key, once per
-- event_id. No row: the event is there already (OutcomeGet tells whether it
-- is the same).
INSERT INTO idemflow_outcome (derived_key, event_id, status, reference, amount, data, failure)
VALUES (@derived_key, @event_id, @status, @reference, @amount, sqlc.narg('data')::jsonb, sqlc.narg('failure')::jsonb)
ON CONFLICT (derived_key, event_id) DO NOTHING
RETURNING received_at;

-- name: OutcomeGet :one
SELECT * FROM idemflow_outcome WHERE derived_key = @derived_key AND event_id = @event_id;

-- name: OutcomeListByKey :many
-- What the inbox holds under derived_key, in the order it arrived.
SELECT * FROM idemflow_outcome WHERE derived_key = @derived_key ORDER BY received_at, event_id;

-- name: OutcomeRefuseNotMade :exec
-- Raises (IF003, IF004), aborting the caller's transaction, when the call of
-- the step under derived_key may not be recorded as not made: see
-- idemflow_refuse_not_made. Sent in the transaction that records it.
SELECT idemflow_refuse_not_made(@operation_id, @name, @derived_key, @by_silence);

-- name: OutcomeSettleBy :one
-- The stored moments from which a request of the operation's step can no
-- longer land (the step's settle_by; the operation's calls_until plus its
-- settle_window), and the database's clock.
SELECT s.settle_by, o.calls_until, o.settle_window, clock_timestamp()::timestamptz AS now
FROM idemflow_operation AS o
LEFT JOIN idemflow_step_row AS s ON s.operation_id = o.id AND s.name = @name
WHERE o.id = @operation_id;

-- name: OutcomeDeleteBefore :execrows
-- Deletes at most max outcomes that the inbox received before before, but
-- those of a step that still waits for its outcome: retention.
DELETE FROM idemflow_outcome
WHERE (derived_key, event_id) IN (
    SELECT o.derived_key, o.event_id FROM idemflow_outcome AS o
    WHERE o.received_at < @before
      AND NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.derived_key = o.derived_key AND s.state = 'waiting')
    LIMIT sqlc.arg(max)::int
);
