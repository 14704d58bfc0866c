-- checkpoints: the steps that succeeded at their first recorded attempt, kept
-- in the operation's row rather than a row each, so that a first attempt
-- writes one row: the reservation carries the checkpoints of its transaction
-- and the statement that ends the operation those of the last. A JSON object
-- by step name: {"p": position, "a": attempts, "r": "call"|"lookup" (external
-- steps), "s": started at (microseconds since 1970 UTC), "d": how long it took
-- (microseconds), "o": the operation's state after the step, as a string
-- holding its JSON (jsonb would reorder its keys, and refuses \u0000), which
-- the checkpoints that a succeeded operation, never run again, adds as it
-- finishes leave out}. A step that failed an attempt, or whose compensation ran, has a
-- row in idemflow_step, which wins over its checkpoint here.
ALTER TABLE idemflow_operation ADD COLUMN checkpoints jsonb;

-- format: the layout of the row's writer, 2 from this migration on, which a
-- binary from before it does not know and so cannot insert: left running
-- through the deploy, such a binary fails every start (the reservation is an
-- insert). Existing rows take 2; there is no default for new ones.
ALTER TABLE idemflow_operation ADD COLUMN format smallint NOT NULL DEFAULT 2;
ALTER TABLE idemflow_operation ALTER COLUMN format DROP DEFAULT;

-- The step rows under a name of their own: a binary from before this
-- migration names idemflow_step in every statement that reads or writes steps,
-- and would read an operation's steps without its checkpoints, then run them
-- again, cancel it past its point of no return, or compensate only some. Under
-- the new name each of those statements fails, and it does none of that.
ALTER TABLE idemflow_step RENAME TO idemflow_step_row;
ALTER INDEX idemflow_step_pkey RENAME TO idemflow_step_row_pkey;

-- Every step an operation has recorded: its rows, and the checkpoints in its
-- operation's row that no row overrides. What the engine reads a run's steps
-- from. A query by operation_id reads one index range of each.
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

---- create above / drop below ----

-- The checkpoints become rows again, for the binaries before this migration.
INSERT INTO idemflow_step_row (operation_id, name, position, state, attempts, output, started_at, finished_at, resolved_by)
SELECT operation_id, name, position, state, attempts, output, started_at, finished_at, resolved_by
FROM idemflow_step_recorded AS r
WHERE NOT EXISTS (SELECT 1 FROM idemflow_step_row AS s WHERE s.operation_id = r.operation_id AND s.name = r.name);
DROP VIEW idemflow_step_recorded;
ALTER INDEX idemflow_step_row_pkey RENAME TO idemflow_step_pkey;
ALTER TABLE idemflow_step_row RENAME TO idemflow_step;
ALTER TABLE idemflow_operation DROP COLUMN format, DROP COLUMN checkpoints;
