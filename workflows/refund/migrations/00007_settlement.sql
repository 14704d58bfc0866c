-- A settlement: a client's whole merchant balance moved to its payout account
-- of the settlement's slot (the start of its period), once per (client, slot).
-- The key outlives the settlement's operation: a slot run again after the
-- engine's retention deleted the operation fails instead of paying out twice.
CREATE TABLE demo_settlement (
    client        text        NOT NULL,
    slot          timestamptz NOT NULL,
    -- What was moved: the merchant's balance, or 0 when it had none.
    amount        bigint      NOT NULL CHECK (amount >= 0),
    operation_id  uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (client, slot)
);

-- A settlement's move: from "merchant" to "payout:<slot>", with no order.
ALTER TABLE demo_ledger_entry
    DROP CONSTRAINT demo_ledger_entry_kind_check,
    ADD CONSTRAINT demo_ledger_entry_kind_check CHECK (kind IN ('order', 'refund', 'refund_reversal', 'settlement'));

---- create above / drop below ----
DELETE FROM demo_ledger_entry WHERE kind = 'settlement';
ALTER TABLE demo_ledger_entry
    DROP CONSTRAINT demo_ledger_entry_kind_check,
    ADD CONSTRAINT demo_ledger_entry_kind_check CHECK (kind IN ('order', 'refund', 'refund_reversal'));
DROP TABLE demo_settlement;
