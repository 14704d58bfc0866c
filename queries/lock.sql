-- name: AdvisoryXactLock :exec
-- Waits for, then holds until the transaction ends, the advisory lock key:
-- transaction-scoped, so that it holds through a pooler in transaction mode.
SELECT pg_advisory_xact_lock(@key::bigint);

-- name: SetLocalUnbounded :exec
-- Lifts the statement, lock and idle-in-transaction timeouts for the rest of
-- the transaction, whoever set them (startup parameters, the role): for a
-- migration, and the wait for another process's.
SELECT set_config('statement_timeout', '0', true),
       set_config('lock_timeout', '0', true),
       set_config('idle_in_transaction_session_timeout', '0', true);

-- name: SetLocalStatementTimeout :exec
SELECT set_config('statement_timeout', sqlc.arg(timeout_ms)::bigint::text, true);
