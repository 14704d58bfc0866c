-- Late and unknown outcomes. A step may wait for its outcome: its call got no
-- definite answer and it is out of attempts (the call may still land at the
-- provider until its settle window has passed), or the provider accepted the
-- call and gives its final status later (pending). Such a step's row says
-- 'waiting'; pending tells the two apart; sent_at is when the step's last
-- request was sent at the latest (the end of its last attempt that called out),
-- from which the settle window runs; waiting_since is when it began waiting;
-- derived_key is a waiting step's derived key.
-- A step's outcome may now also come from the application (an event, such as
-- a provider's webhook) or an operator.
--
-- The new checks allow everything the old ones did; they are added NOT VALID
-- (every existing row passed the old ones), so that no row is read while the
-- table is locked.
ALTER TABLE idemflow_step_row
    ADD COLUMN sent_at       timestamptz,
    ADD COLUMN pending       boolean NOT NULL DEFAULT false,
    ADD COLUMN waiting_since timestamptz,
    ADD COLUMN derived_key   text,
    ADD CONSTRAINT idemflow_step_row_state
        CHECK (state IN ('retrying', 'waiting', 'succeeded', 'failed', 'compensated')) NOT VALID,
    ADD CONSTRAINT idemflow_step_row_resolved_by
        CHECK (resolved_by IN ('call', 'lookup', 'event', 'operator')) NOT VALID,
    DROP CONSTRAINT idemflow_step_state_check,
    DROP CONSTRAINT idemflow_step_resolved_by_check;

-- A waiting step is found by its derived key: what a provider's webhook names.
CREATE INDEX idemflow_step_row_waiting_key ON idemflow_step_row (derived_key)
    WHERE state = 'waiting';

-- calls_until: a run may have been calling out until then, although no
-- failure of the call was recorded: the lease end of a run whose lease
-- expired (the sweeper hands the operation on) or the moment a stopped run
-- let go of it. A request sent then may still land up to its settle window
-- later; Cancel waits for it.
ALTER TABLE idemflow_operation ADD COLUMN calls_until timestamptz;

-- prior_error: the server-fault answer of a failed operation that an
-- operator reopened by force, which its key replays until it finishes again.
ALTER TABLE idemflow_operation ADD COLUMN prior_error jsonb;

-- The operators' requests become the operation's audit trail: every retry,
-- cancel and resolve, done or refused, whoever asked (actor), kept as long as
-- the operation (a cascade from its row). force: a retry of an operation that
-- ended with a server fault, which only a forced retry reopens; made and
-- reference: a resolve's word. The new checks allow what the old one did.
ALTER TABLE idemflow_operator_request
    ADD COLUMN force     boolean NOT NULL DEFAULT false,
    ADD COLUMN actor     text    NOT NULL DEFAULT '',
    ADD COLUMN made      boolean,
    ADD COLUMN reference text,
    ADD CONSTRAINT idemflow_operator_request_action
        CHECK (action IN ('retry', 'cancel', 'resolve')) NOT VALID,
    DROP CONSTRAINT idemflow_operator_request_action_check,
    ADD CONSTRAINT idemflow_operator_request_operation
        FOREIGN KEY (operation_id) REFERENCES idemflow_operation (id) ON DELETE CASCADE NOT VALID;
CREATE INDEX idemflow_operator_request_operation ON idemflow_operator_request (operation_id);

-- The view gains the new columns at its end (CREATE OR REPLACE VIEW may only
-- add columns there); a checkpoint in the operation's row never waits.
CREATE OR REPLACE VIEW idemflow_step_recorded AS
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

---- create above / drop below ----

-- A binary from before this migration knows neither a waiting step nor an
-- outcome from an event or an operator: a waiting step becomes 'retrying'
-- (that binary asks its lookup, then compensates on "not found" at once: run
-- it only once no step waits), and the new resolutions read as 'lookup'.
UPDATE idemflow_step_row SET state = 'retrying' WHERE state = 'waiting';
ALTER TABLE idemflow_operation DROP COLUMN prior_error;
ALTER TABLE idemflow_operation DROP COLUMN calls_until;
DELETE FROM idemflow_operator_request WHERE action = 'resolve';
DROP INDEX idemflow_operator_request_operation;
ALTER TABLE idemflow_operator_request
    ADD CONSTRAINT idemflow_operator_request_action_check CHECK (action IN ('retry', 'cancel')) NOT VALID,
    DROP CONSTRAINT idemflow_operator_request_action,
    DROP CONSTRAINT idemflow_operator_request_operation,
    DROP COLUMN reference,
    DROP COLUMN made,
    DROP COLUMN actor,
    DROP COLUMN force;
UPDATE idemflow_step_row SET resolved_by = 'lookup' WHERE resolved_by IN ('event', 'operator');
DROP VIEW idemflow_step_recorded;
CREATE VIEW idemflow_step_recorded AS
SELECT s.operation_id, s.name, s.position, s.state, s.attempts, s.output, s.last_error,
       s.started_at, s.finished_at, s.last_cause, s.resolved_by, s.compensations
FROM idemflow_step_row AS s
UNION ALL
SELECT o.id, c.key, (c.value ->> 'p')::integer, 'succeeded'::text, (c.value ->> 'a')::integer,
       (c.value ->> 'o')::json, NULL::text,
       timestamptz 'epoch' + (c.value ->> 's')::bigint * interval '1 microsecond',
       timestamptz 'epoch' + ((c.value ->> 's')::bigint + (c.value ->> 'd')::bigint) * interval '1 microsecond',
       NULL::text,
       c.value ->> 'r', 0
FROM idemflow_operation AS o
CROSS JOIN LATERAL jsonb_each(o.checkpoints) AS c
WHERE o.checkpoints IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.operation_id = o.id AND s.name = c.key);
ALTER TABLE idemflow_step_row
    ADD CONSTRAINT idemflow_step_state_check
        CHECK (state IN ('retrying', 'succeeded', 'failed', 'compensated')) NOT VALID,
    ADD CONSTRAINT idemflow_step_resolved_by_check
        CHECK (resolved_by IN ('call', 'lookup')) NOT VALID,
    DROP CONSTRAINT idemflow_step_row_state,
    DROP CONSTRAINT idemflow_step_row_resolved_by,
    DROP COLUMN waiting_since,
    DROP COLUMN derived_key,
    DROP COLUMN pending,
    DROP COLUMN sent_at;
