-- name: StatDatabase :one
-- The transactions that committed and rolled back in a database, the shared
-- buffers its statements looked up (found in memory, or read in), and its
-- sessions, as far as the server's statistics have been published.
SELECT pg_stat_get_db_xact_commit(d.oid)::bigint AS commits,
       pg_stat_get_db_xact_rollback(d.oid)::bigint AS rollbacks,
       pg_stat_get_db_blocks_hit(d.oid)::bigint AS blocks_hit,
       (pg_stat_get_db_blocks_fetched(d.oid) - pg_stat_get_db_blocks_hit(d.oid))::bigint AS blocks_read,
       pg_stat_get_db_numbackends(d.oid)::bigint AS backends
FROM pg_catalog.pg_database AS d
WHERE d.datname = @datname;

-- name: StatWAL :one
-- The cluster's WAL activity (PostgreSQL 14 and later).
SELECT w.wal_records::bigint AS records, w.wal_bytes::bigint AS bytes,
       w.wal_write::bigint AS writes, w.wal_sync::bigint AS syncs
FROM pg_stat_get_wal() AS w;

-- name: StatClearSnapshot :exec
-- Drops this session's cached statistics, so that the next read sees what the
-- server has now.
SELECT pg_stat_clear_snapshot();

-- name: StatForceNextFlush :exec
-- Makes this backend publish its pending statistics when it next goes idle
-- (PostgreSQL 15 and later), instead of up to 10 seconds later.
SELECT pg_stat_force_next_flush();

-- name: ServerSettings :one
-- What the figures depend on.
SELECT current_setting('server_version') AS server_version,
       current_setting('server_version_num')::integer AS server_version_num,
       current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes,
       current_setting('wal_sync_method') AS wal_sync_method,
       current_setting('shared_buffers') AS shared_buffers,
       current_setting('max_connections') AS max_connections;
