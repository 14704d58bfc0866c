-- name: FaultSet :exec
-- Replaces the fault to inject, if any.
INSERT INTO provider.fault (singleton, mode, remaining, delay_ms, outcome)
VALUES (true, @mode, @remaining, @delay_ms, @outcome)
ON CONFLICT (singleton) DO UPDATE
SET mode = excluded.mode,
    remaining = excluded.remaining,
    delay_ms = excluded.delay_ms,
    outcome = excluded.outcome;

-- name: FaultClear :exec
DELETE FROM provider.fault;

-- name: FaultTake :one
-- Takes one injection of the fault for a refund POST, if any is left (the
-- fault lookup_error is the lookups'): the row lock makes two concurrent
-- requests take two.
UPDATE provider.fault
SET remaining = remaining - 1
WHERE singleton AND remaining > 0 AND mode <> 'lookup_error'
RETURNING mode, delay_ms, outcome;

-- name: FaultTakeLookup :one
-- Takes one injection of the fault lookup_error for a lookup by key, if any
-- is left, as FaultTake does for a refund POST.
UPDATE provider.fault
SET remaining = remaining - 1
WHERE singleton AND remaining > 0 AND mode = 'lookup_error'
RETURNING mode;
