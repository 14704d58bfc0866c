-- name: AdvisoryLock :exec
SELECT pg_advisory_lock(@key::bigint);

-- name: AdvisoryUnlock :exec
SELECT pg_advisory_unlock(@key::bigint);

-- name: SetLocalStatementTimeout :exec
SELECT set_config('statement_timeout', sqlc.arg(timeout_ms)::bigint::text, true);
