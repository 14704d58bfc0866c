-- name: HistoryRefundInsertSeries :execrows
-- The succeeded refunds of those operations, one of amount per order prefix1 to
-- prefixN that OrderInsertSeries recorded, with the ids the operations store,
-- each counted in its order's refunded as the refund's ledger step counts it.
-- The rows are the orders updated.
WITH refund AS (
    INSERT INTO demo_refund (id, client, order_id, amount, status, provider_refund_id, created_at, updated_at)
    SELECT 're_' || sqlc.arg(prefix)::text || g, @client, sqlc.arg(prefix)::text || g, sqlc.arg(amount)::bigint, 'succeeded',
           'pr_' || sqlc.arg(prefix)::text || g, now() - interval '1 hour', now() - interval '1 hour'
    FROM generate_series(1, sqlc.arg(count)::int) AS g
    RETURNING client, order_id, amount
)
UPDATE demo_order AS o
SET refunded = o.refunded + r.amount
FROM refund AS r
WHERE o.client = r.client AND o.order_id = r.order_id;

-- name: HistoryOperationInsertSeries :execrows
-- Inserts count refund operations of the engine in scope, of amount each, with
-- keys (and order ids) prefix1 to prefixN, finished in the past hour (within any
-- retention), as the engine leaves a refund that succeeded at its first attempt:
-- its 3 steps as checkpoints in its row (store migration 00010), kept 24 hours.
-- The ids are time-ordered, version 7 like the engine's, so that the primary
-- key's history sorts before what the timed modes insert.
INSERT INTO idemflow_operation (id, name, scope, key, state, steps, input, result, checkpoints,
                                runs, locked_by, locked_until, created_at, finished_at, expires_at, format)
SELECT (lpad(to_hex((extract(epoch FROM t.finished_at) * 1000)::bigint), 12, '0') || '7'
        || substr(replace(gen_random_uuid()::text, '-', ''), 14, 19))::uuid,
       'refund', sqlc.arg(scope)::text, sqlc.arg(prefix)::text || g, 'succeeded',
       ARRAY['ledger', 'provider', 'finalize'],
       json_build_object('client', sqlc.arg(scope)::text, 'orderId', sqlc.arg(prefix)::text || g, 'amount', sqlc.arg(amount)::bigint),
       json_build_object('refundId', 're_' || sqlc.arg(prefix)::text || g, 'orderId', sqlc.arg(prefix)::text || g,
                         'amount', sqlc.arg(amount)::bigint, 'status', 'succeeded',
                         'providerRefundId', 'pr_' || sqlc.arg(prefix)::text || g),
       (SELECT jsonb_object_agg(s.name, jsonb_build_object(
                   'p', s.position, 'a', 1,
                   's', (extract(epoch FROM t.finished_at) * 1000000)::bigint - 5000, 'd', 5000)
                || CASE WHEN s.name = 'provider' THEN jsonb_build_object('r', 'call') ELSE '{}'::jsonb END)
        FROM (VALUES ('ledger', 0), ('provider', 1), ('finalize', 2)) AS s (name, position)),
       1, NULL, t.finished_at + interval '5 minutes', t.finished_at - interval '5 milliseconds', t.finished_at,
       t.finished_at + interval '24 hours', 2
FROM generate_series(1, sqlc.arg(count)::integer) AS g
CROSS JOIN LATERAL (SELECT now() - interval '1 hour' + interval '1 hour' * g / (sqlc.arg(count)::integer + 1) AS finished_at) AS t;

-- name: HistoryOperationExpiringInsertSeries :execrows
-- Inserts the finished refund operations first to last of -mode history, as
-- HistoryOperationInsertSeries does (keys and order ids prefix<g>, no orders or
-- refunds beside them), but with the end of their retention spread: operation g
-- expires at expires_from plus (g - 1) / rate seconds, so that a retention run
-- whose clock moves on from expires_from finds rate of them expired per second.
INSERT INTO idemflow_operation (id, name, scope, key, state, steps, input, result, checkpoints,
                                runs, locked_by, locked_until, created_at, finished_at, expires_at, format)
SELECT (lpad(to_hex((extract(epoch FROM t.finished_at) * 1000)::bigint), 12, '0') || '7'
        || substr(replace(gen_random_uuid()::text, '-', ''), 14, 19))::uuid,
       'refund', sqlc.arg(scope)::text, sqlc.arg(prefix)::text || g, 'succeeded',
       ARRAY['ledger', 'provider', 'finalize'],
       json_build_object('client', sqlc.arg(scope)::text, 'orderId', sqlc.arg(prefix)::text || g, 'amount', sqlc.arg(amount)::bigint),
       json_build_object('refundId', 're_' || sqlc.arg(prefix)::text || g, 'orderId', sqlc.arg(prefix)::text || g,
                         'amount', sqlc.arg(amount)::bigint, 'status', 'succeeded',
                         'providerRefundId', 'pr_' || sqlc.arg(prefix)::text || g),
       (SELECT jsonb_object_agg(s.name, jsonb_build_object(
                   'p', s.position, 'a', 1,
                   's', (extract(epoch FROM t.finished_at) * 1000000)::bigint - 5000, 'd', 5000)
                || CASE WHEN s.name = 'provider' THEN jsonb_build_object('r', 'call') ELSE '{}'::jsonb END)
        FROM (VALUES ('ledger', 0), ('provider', 1), ('finalize', 2)) AS s (name, position)),
       1, NULL, t.finished_at + interval '5 minutes', t.finished_at - interval '5 milliseconds', t.finished_at,
       sqlc.arg(expires_from)::timestamptz + make_interval(secs => (g - 1) / sqlc.arg(rate)::float8), 2
FROM generate_series(sqlc.arg(first)::integer, sqlc.arg(last)::integer) AS g
CROSS JOIN LATERAL (SELECT now() - interval '1 hour' + interval '1 microsecond' * g AS finished_at) AS t;

-- name: HistoryTableStats :many
-- The size and the dead rows of each table named: the table with its indexes
-- and TOAST, its main fork, its indexes; the live and dead rows and the
-- deletes as the statistics last published them; the vacuums and autovacuums
-- that ended, and the seconds since the last autovacuum ended (-1: none yet).
SELECT t.name::text AS name,
       pg_total_relation_size(t.name::regclass)::bigint AS total_bytes,
       pg_relation_size(t.name::regclass)::bigint AS heap_bytes,
       pg_indexes_size(t.name::regclass)::bigint AS index_bytes,
       coalesce(pg_stat_get_live_tuples(t.name::regclass::oid), 0)::bigint AS live_rows,
       coalesce(pg_stat_get_dead_tuples(t.name::regclass::oid), 0)::bigint AS dead_rows,
       coalesce(pg_stat_get_tuples_deleted(t.name::regclass::oid), 0)::bigint AS deleted_rows,
       coalesce(pg_stat_get_autovacuum_count(t.name::regclass::oid), 0)::bigint AS autovacuums,
       coalesce(pg_stat_get_vacuum_count(t.name::regclass::oid), 0)::bigint AS vacuums,
       coalesce(extract(epoch FROM now() - pg_stat_get_last_autovacuum_time(t.name::regclass::oid)), -1)::float8 AS since_autovacuum_s
FROM unnest(sqlc.arg(names)::text[]) AS t (name)
ORDER BY t.name;
