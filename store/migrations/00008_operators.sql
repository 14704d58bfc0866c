-- The processes that run an engine with workers, and the definitions (name and
-- version) each runs: what an operator's command, which has no definitions of
-- its own, checks unfinished operations against. A row is refreshed every
-- sweep and deleted when its engine stops; one not seen for three leases is
-- taken for dead.
CREATE TABLE idemflow_process (
    id          uuid        PRIMARY KEY,
    host        text        NOT NULL,
    pid         integer     NOT NULL,
    definitions text[]      NOT NULL,
    lease       interval    NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);

-- An operator's request to retry (reopen) or cancel an operation, recorded by a
-- command that has no definitions and carried out by a live process that runs
-- the operation's definition. taken_by and taken_at: the process that carries
-- it out (taken again by another once taken_at is a lease old and it is not
-- done); outcome and message: what happened.
CREATE TABLE idemflow_operator_request (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operation_id uuid        NOT NULL,
    action       text        NOT NULL CHECK (action IN ('retry', 'cancel')),
    reason       text        NOT NULL DEFAULT '',
    requested_at timestamptz NOT NULL DEFAULT now(),
    taken_by     uuid,
    taken_at     timestamptz,
    done_at      timestamptz,
    outcome      text        CHECK (outcome IN ('done', 'refused', 'failed')),
    message      text,
    CONSTRAINT idemflow_operator_request_done CHECK ((done_at IS NULL) = (outcome IS NULL))
);

CREATE INDEX idemflow_operator_request_pending ON idemflow_operator_request (id)
    WHERE done_at IS NULL;

---- create above / drop below ----

DROP TABLE idemflow_operator_request;
DROP TABLE idemflow_process;
