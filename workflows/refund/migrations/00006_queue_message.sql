-- An order that a client sent as a queued message (POST /queue/orders), by the
-- client's message id: what the consumer made of it. The job that carries it is
-- inserted in the transaction that inserts this row; every delivery of the job
-- counts itself here in its own transaction, the one that starts the message's
-- order operation (consumed) or refuses it (rejected: the message id holds an
-- operation started with another body).
CREATE TABLE demo_queue_message (
    client        text        NOT NULL,
    message_id    text        NOT NULL CHECK (message_id <> ''),
    status        text        NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'consumed', 'rejected')),
    -- The deliveries consumed or rejected.
    deliveries    integer     NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    -- The order operation that holds the message id, once a delivery found it.
    operation_id  uuid,
    -- Why a delivery was rejected.
    error         text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (client, message_id)
);

---- create above / drop below ----
DROP TABLE demo_queue_message;
