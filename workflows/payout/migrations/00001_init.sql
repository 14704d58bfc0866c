-- A wallet that payouts are paid from. Its balance is in minor units and never
-- goes below zero: the debit step takes a payout's amount only while it fits.
CREATE TABLE payout_wallet (
    id          text        PRIMARY KEY CHECK (id <> ''),
    balance     bigint      NOT NULL CHECK (balance >= 0),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A payout from a wallet to a bank account. Its id is the id of the operation
-- that makes it. It is pending from the debit step until the bank has paid
-- (paid, with the bank's id of the payout) or refused (reversed, its amount
-- credited back to the wallet).
CREATE TABLE payout (
    id              uuid        PRIMARY KEY,
    wallet          text        NOT NULL REFERENCES payout_wallet (id),
    amount          bigint      NOT NULL CHECK (amount > 0),
    destination     text        NOT NULL CHECK (destination <> ''),
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'paid', 'reversed')),
    bank_payout_id  text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT payout_paid CHECK (status <> 'paid' OR bank_payout_id IS NOT NULL)
);

-- Lists a wallet's payouts, oldest first.
CREATE INDEX payout_wallet_created ON payout (wallet, created_at);

---- create above / drop below ----
DROP TABLE payout;
DROP TABLE payout_wallet;
