-- The baseline's reservation of an idempotency key: the hand-written refund's
-- counterpart of idemflow_operation, with the same key, lease and stored answer
-- and the same indexes, and no engine behind it.
CREATE TABLE bench_operation (
    id            uuid        PRIMARY KEY,
    scope         text        NOT NULL,
    key           text        NOT NULL CHECK (key <> ''),
    state         text        NOT NULL DEFAULT 'in_progress'
                              CHECK (state IN ('in_progress', 'succeeded', 'failed')),
    input         json        NOT NULL,
    result        json,
    locked_by     uuid,
    locked_until  timestamptz NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    CONSTRAINT bench_operation_scope_key UNIQUE (scope, key),
    CONSTRAINT bench_operation_finished CHECK ((state = 'in_progress') = (finished_at IS NULL))
);

CREATE INDEX bench_operation_lease ON bench_operation (locked_until)
    WHERE state = 'in_progress';

CREATE INDEX bench_operation_finished_at ON bench_operation (finished_at)
    WHERE state <> 'in_progress';

---- create above / drop below ----
DROP TABLE bench_operation;
