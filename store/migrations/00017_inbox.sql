-- The provider's word, whenever it arrives. Rolling: it only adds, so a binary
-- from before it keeps working beside one after it.
--
-- idemflow_outcome is the engine's inbox: what an outside service said of the
-- call made under a derived key (a webhook's event), kept whatever the step's
-- state when it arrives (not begun, calling, waiting, finished), once per
-- (derived_key, event_id). A step that waits applies it; a success in it
-- forbids every "not made" under its key (idemflow_refuse_not_made).
CREATE TABLE idemflow_outcome (
    derived_key text        NOT NULL,
    event_id    text        NOT NULL,
    status      text        NOT NULL CONSTRAINT idemflow_outcome_status CHECK (status IN ('succeeded', 'failed', 'pending')),
    reference   text        NOT NULL DEFAULT '',
    amount      bigint      NOT NULL DEFAULT 0,
    data        jsonb,
    failure     jsonb,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (derived_key, event_id)
);

-- settle_by: when a request of the step that got no definite answer can no
-- longer land, by the database's clock: now() at its recording plus the
-- step's window, fixed when the request was sent and never moved earlier.
-- reference: the outside service's reference of a call it accepted as pending.
ALTER TABLE idemflow_step_row
    ADD COLUMN settle_by timestamptz,
    ADD COLUMN reference text;

-- settle_window: the longest settle window of the external steps of any
-- process that ran the operation (its reservation's, then every claim's), for
-- a request that a run may have been sending until calls_until.
ALTER TABLE idemflow_operation ADD COLUMN settle_window interval;

CREATE OR REPLACE VIEW idemflow_step_recorded AS
SELECT s.operation_id, s.name, s.position, s.state, s.attempts, s.output, s.last_error,
       s.started_at, s.finished_at, s.last_cause, s.resolved_by, s.compensations,
       s.sent_at, s.pending, s.waiting_since, s.settle_by, s.reference
FROM idemflow_step_row AS s
UNION ALL
SELECT o.id, c.key, (c.value ->> 'p')::integer, 'succeeded'::text, (c.value ->> 'a')::integer,
       (c.value ->> 'o')::json, NULL::text,
       timestamptz 'epoch' + (c.value ->> 's')::bigint * interval '1 microsecond',
       timestamptz 'epoch' + ((c.value ->> 's')::bigint + (c.value ->> 'd')::bigint) * interval '1 microsecond',
       NULL::text,
       c.value ->> 'r', 0,
       NULL::timestamptz, false, NULL::timestamptz, NULL::timestamptz, NULL::text
FROM idemflow_operation AS o
CROSS JOIN LATERAL jsonb_each(o.checkpoints) AS c
WHERE o.checkpoints IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.operation_id = o.id AND s.name = c.key);

-- idemflow_outcome_lock serialises, per derived key, the inbox's writers and
-- the transactions that decide a call under it was not made: whichever
-- commits first, the other sees it.
CREATE FUNCTION idemflow_outcome_lock(key text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(hashtextextended('idemflow_outcome:' || key, 0))
$$;

-- idemflow_refuse_not_made raises, aborting the transaction that would record
-- that the call of the operation's step under key was not made (and
-- compensate), when the inbox holds a success under key (SQLSTATE IF003), or,
-- with by_silence (nothing found, no answer), when a request of the step may
-- still land by the database's clock: before the step's settle_by, or before
-- the operation's calls_until plus its settle_window (IF004, the moment as
-- DETAIL).
CREATE FUNCTION idemflow_refuse_not_made(op uuid, step text, key text, by_silence boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    until timestamptz;
BEGIN
    PERFORM idemflow_outcome_lock(key);
    IF EXISTS (SELECT 1 FROM idemflow_outcome WHERE derived_key = key AND status = 'succeeded') THEN
        RAISE EXCEPTION 'idemflow: the outside service reported the call under the key as succeeded'
            USING ERRCODE = 'IF003';
    END IF;
    IF by_silence THEN
        SELECT greatest(
                   (SELECT s.settle_by FROM idemflow_step_row AS s WHERE s.operation_id = op AND s.name = step),
                   (SELECT o.calls_until + o.settle_window FROM idemflow_operation AS o WHERE o.id = op))
        INTO until;
        IF until IS NOT NULL AND until > clock_timestamp() THEN
            RAISE EXCEPTION 'idemflow: a request of the step may still land'
                USING ERRCODE = 'IF004', DETAIL = to_char(until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
        END IF;
    END IF;
    RETURN true;
END
$$;

---- create above / drop below ----

DROP FUNCTION idemflow_refuse_not_made(uuid, text, text, boolean);
DROP FUNCTION idemflow_outcome_lock(text);
DROP VIEW idemflow_step_recorded;
CREATE VIEW idemflow_step_recorded AS
SELECT s.operation_id, s.name, s.position, s.state, s.attempts, s.output, s.last_error,
       s.started_at, s.finished_at, s.last_cause, s.resolved_by, s.compensations,
       s.sent_at, s.pending, s.waiting_since
FROM idemflow_step_row AS s
UNION ALL
SELECT o.id, c.key, (c.value ->> 'p')::integer, 'succeeded'::text, (c.value ->> 'a')::integer,
       (c.value ->> 'o')::json, NULL::text,
       timestamptz 'epoch' + (c.value ->> 's')::bigint * interval '1 microsecond',
       timestamptz 'epoch' + ((c.value ->> 's')::bigint + (c.value ->> 'd')::bigint) * interval '1 microsecond',
       NULL::text,
       c.value ->> 'r', 0,
       NULL::timestamptz, false, NULL::timestamptz
FROM idemflow_operation AS o
CROSS JOIN LATERAL jsonb_each(o.checkpoints) AS c
WHERE o.checkpoints IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.operation_id = o.id AND s.name = c.key);
ALTER TABLE idemflow_operation DROP COLUMN settle_window;
ALTER TABLE idemflow_step_row DROP COLUMN reference, DROP COLUMN settle_by;
DROP TABLE idemflow_outcome;
