-- An order that a client's customer paid. Recording it moved its amount from the
-- customer's ledger account to the merchant's.
CREATE TABLE demo_order (
    client       text        NOT NULL,
    order_id     text        NOT NULL CHECK (order_id <> ''),
    customer_id  text        NOT NULL CHECK (customer_id <> ''),
    amount       bigint      NOT NULL CHECK (amount > 0),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (client, order_id)
);

-- A refund of part or all of an order. It is pending from the ledger step until
-- the provider confirms it (succeeded) or declines it (failed, and its ledger
-- move reversed).
CREATE TABLE demo_refund (
    id                  text        PRIMARY KEY CHECK (id LIKE 're\_%'),
    client              text        NOT NULL,
    order_id            text        NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    status              text        NOT NULL DEFAULT 'pending'
                                    CHECK (status IN ('pending', 'succeeded', 'failed')),
    provider_refund_id  text,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT demo_refund_order FOREIGN KEY (client, order_id) REFERENCES demo_order (client, order_id),
    CONSTRAINT demo_refund_succeeded CHECK (status <> 'succeeded' OR provider_refund_id IS NOT NULL)
);

-- Lists an order's refunds, oldest first.
CREATE INDEX demo_refund_client_order ON demo_refund (client, order_id, created_at);

-- The double-entry ledger: every move of money is two entries of one move_id,
-- written by one statement, whose amounts sum to zero (the debit negative, the
-- credit positive). A balance is the sum of an account's entries.
CREATE TABLE demo_ledger_entry (
    id          bigserial   PRIMARY KEY,
    client      text        NOT NULL,
    move_id     uuid        NOT NULL,
    account     text        NOT NULL CHECK (account <> ''),
    amount      bigint      NOT NULL CHECK (amount <> 0),
    -- Why the money moved: an order paid, a refund, a refund's reversal.
    kind        text        NOT NULL CHECK (kind IN ('order', 'refund', 'refund_reversal')),
    order_id    text        NOT NULL,
    refund_id   text        REFERENCES demo_refund (id),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX demo_ledger_entry_client_account ON demo_ledger_entry (client, account);
CREATE INDEX demo_ledger_entry_move ON demo_ledger_entry (move_id);

---- create above / drop below ----
DROP TABLE demo_ledger_entry;
DROP TABLE demo_refund;
DROP TABLE demo_order;
