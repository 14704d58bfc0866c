-- Waits for people and time: steps that wait for a signal, a moment, or
-- operators' approvals. Rolling: it only adds, so a binary from before it
-- keeps working beside one after it (its processes never run a wait step).
--
-- idemflow_signal keeps what was sent to an operation, once per (operation,
-- signal_id), whether or not a step waits for it yet: the step that waits
-- for its name applies the first one when it gets there. An approval is a
-- signal named 'idemflow.approve' whose id is the actor's, so that the same
-- actor counts once; a rejection one named 'idemflow.reject'.
CREATE TABLE idemflow_signal (
    operation_id uuid        NOT NULL REFERENCES idemflow_operation (id) ON DELETE CASCADE,
    signal_id    text        NOT NULL,
    name         text        NOT NULL,
    payload      jsonb,
    actor        text        NOT NULL DEFAULT '',
    reason       text        NOT NULL DEFAULT '',
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, signal_id)
);

-- A step that waits for people or time: why (wait_reason 'signal', 'timer'
-- or 'approval'; null for an external step waiting for its outcome), for
-- which signal, until when (the deadline or the timer's moment, by the
-- database's clock, fixed when the step was reached), and how many distinct
-- approvals it needs. All are fixed when the step is reached and never
-- change after.
ALTER TABLE idemflow_step_row
    ADD COLUMN wait_reason text,
    ADD COLUMN wait_signal text,
    ADD COLUMN wait_until  timestamptz,
    ADD COLUMN wait_need   integer;

-- wake_at: when an operation that a wait hands back with no process busy on
-- it is due again (a timer's moment, a deadline); null otherwise. Each
-- process's timer loop reads the earliest one, so that a moment is kept
-- within a second, however many operations wait.
ALTER TABLE idemflow_operation ADD COLUMN wake_at timestamptz;
CREATE INDEX idemflow_operation_wake ON idemflow_operation (wake_at) WHERE wake_at IS NOT NULL;

-- The leases that runs hold: the takeover's scan for a dead process's runs
-- (OperationListOrphaned, four times a second in every process) reads them
-- only, rather than every unfinished operation, of which those that wait
-- for people or time may be many (their lease runs until their moment, or a
-- century when they have none).
CREATE INDEX idemflow_operation_held ON idemflow_operation (locked_until)
    WHERE locked_by IS NOT NULL AND state = 'in_progress';

-- What waits for people or time, oldest first: the operators' list of what
-- waits for approval reads one range of it.
CREATE INDEX idemflow_step_row_wait ON idemflow_step_row (wait_reason, waiting_since)
    WHERE state = 'waiting' AND wait_reason IS NOT NULL;

-- Operators' approvals and rejections are audited as their other requests.
ALTER TABLE idemflow_operator_request
    ADD CONSTRAINT idemflow_operator_request_action_waits
        CHECK (action IN ('retry', 'cancel', 'resolve', 'approve', 'reject')) NOT VALID,
    DROP CONSTRAINT idemflow_operator_request_action;
ALTER TABLE idemflow_operator_request VALIDATE CONSTRAINT idemflow_operator_request_action_waits;
-- code: why a refused request was refused (the engine's refusal code), so
-- that an operator's handle that asked a live process to carry it out
-- returns the same error as the process's own call would.
ALTER TABLE idemflow_operator_request ADD COLUMN code text;

CREATE OR REPLACE VIEW idemflow_step_recorded AS
SELECT s.operation_id, s.name, s.position, s.state, s.attempts, s.output, s.last_error,
       s.started_at, s.finished_at, s.last_cause, s.resolved_by, s.compensations,
       s.sent_at, s.pending, s.waiting_since, s.settle_by, s.reference,
       s.wait_reason, s.wait_signal, s.wait_until, s.wait_need
FROM idemflow_step_row AS s
UNION ALL
SELECT o.id, c.key, (c.value ->> 'p')::integer, 'succeeded'::text, (c.value ->> 'a')::integer,
       (c.value ->> 'o')::json, NULL::text,
       timestamptz 'epoch' + (c.value ->> 's')::bigint * interval '1 microsecond',
       timestamptz 'epoch' + ((c.value ->> 's')::bigint + (c.value ->> 'd')::bigint) * interval '1 microsecond',
       NULL::text,
       c.value ->> 'r', 0,
       NULL::timestamptz, false, NULL::timestamptz, NULL::timestamptz, NULL::text,
       NULL::text, NULL::text, NULL::timestamptz, NULL::integer
FROM idemflow_operation AS o
CROSS JOIN LATERAL jsonb_each(o.checkpoints) AS c
WHERE o.checkpoints IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.operation_id = o.id AND s.name = c.key);

---- create above / drop below ----

ALTER TABLE idemflow_operator_request DROP COLUMN code;

ALTER TABLE idemflow_operator_request
    ADD CONSTRAINT idemflow_operator_request_action
        CHECK (action IN ('retry', 'cancel', 'resolve')) NOT VALID,
    DROP CONSTRAINT idemflow_operator_request_action_waits;

DROP VIEW idemflow_step_recorded;
CREATE VIEW idemflow_step_recorded AS
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
DROP INDEX idemflow_step_row_wait;
DROP INDEX idemflow_operation_held;
DROP INDEX idemflow_operation_wake;
ALTER TABLE idemflow_operation DROP COLUMN wake_at;
ALTER TABLE idemflow_step_row DROP COLUMN wait_need, DROP COLUMN wait_until, DROP COLUMN wait_signal, DROP COLUMN wait_reason;
DROP TABLE idemflow_signal;
