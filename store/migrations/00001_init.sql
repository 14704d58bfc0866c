-- One row per operation, keyed by the client's idempotency key within its scope.
-- The row is the reservation, the lease and the stored answer at once.
CREATE TABLE idemflow_operation (
    id            uuid        PRIMARY KEY,
    name          text        NOT NULL CHECK (name <> ''),
    scope         text        NOT NULL,
    key           text        NOT NULL CHECK (key <> ''),
    state         text        NOT NULL DEFAULT 'in_progress'
                              CHECK (state IN ('in_progress', 'succeeded', 'failed')),
    -- The step list the operation was started with, for resume and versioning.
    steps         text[]      NOT NULL,
    input         json        NOT NULL,
    -- Opaque to the engine: what the caller needs to tell a retry from a new request.
    fingerprint   jsonb,
    -- Exact bytes of the final result (json keeps them as written, for byte-identical replays).
    result        json,
    -- The permanent error that ended the operation, when it failed.
    error         jsonb,
    -- How many runs (the first attempt, then every resume) have claimed the operation.
    runs          integer     NOT NULL DEFAULT 1,
    -- The run that holds the operation; null while it waits for a River job.
    locked_by     uuid,
    -- Until when the holder (or the scheduled job) owns the operation; after it, the
    -- sweeper may hand the operation to another process.
    locked_until  timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    CONSTRAINT idemflow_operation_scope_key UNIQUE (scope, key),
    CONSTRAINT idemflow_operation_finished CHECK ((state = 'in_progress') = (finished_at IS NULL))
);

-- Keeps the sweeper's scan to operations in progress.
CREATE INDEX idemflow_operation_lease ON idemflow_operation (locked_until)
    WHERE state = 'in_progress';

-- Keeps retention's scan to finished operations.
CREATE INDEX idemflow_operation_finished_at ON idemflow_operation (finished_at)
    WHERE state <> 'in_progress';

-- One row per step that has been checkpointed or has failed an attempt.
-- A step with no row has not finished any attempt yet.
CREATE TABLE idemflow_step (
    operation_id  uuid        NOT NULL REFERENCES idemflow_operation (id) ON DELETE CASCADE,
    name          text        NOT NULL,
    position      integer     NOT NULL,
    state         text        NOT NULL
                              CHECK (state IN ('retrying', 'succeeded', 'failed', 'compensated')),
    attempts      integer     NOT NULL,
    -- The operation's state after the step, read back on resume.
    output        json,
    last_error    text,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    PRIMARY KEY (operation_id, name)
);

---- create above / drop below ----
DROP TABLE idemflow_step;
DROP TABLE idemflow_operation;
