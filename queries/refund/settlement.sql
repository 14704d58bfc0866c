-- name: SettlementLock :exec
-- Serialises the settlements of one client, for the rest of the transaction:
-- the statement after it reads the balance that the settlement before it left
-- (under READ COMMITTED each statement reads what committed before it began).
SELECT pg_advisory_xact_lock(hashtextextended('demo settlement ' || @client::text, 0));

-- name: SettlementMake :one
-- Settles a client's slot in one statement: reads the merchant's balance,
-- records the settlement of it (0 when it is not positive) and moves it to the
-- slot's payout account. No row back: the slot is settled already, and
-- nothing was written. Run it after SettlementLock.
WITH balance AS (
    SELECT greatest(coalesce(sum(e.amount), 0), 0)::bigint AS amount
    FROM demo_ledger_entry AS e
    WHERE e.client = @client AND e.account = sqlc.arg(merchant_account)::text
), settlement AS (
    INSERT INTO demo_settlement (client, slot, amount, operation_id)
    SELECT @client, @slot, b.amount, @operation_id FROM balance AS b
    ON CONFLICT (client, slot) DO NOTHING
    RETURNING client, amount
), entries AS (
    INSERT INTO demo_ledger_entry (client, move_id, account, amount, kind, order_id)
    SELECT s.client, @move_id, m.account, m.amount, 'settlement', ''
    FROM settlement AS s
    CROSS JOIN LATERAL (VALUES (sqlc.arg(merchant_account)::text, 0 - s.amount),
                               (sqlc.arg(payout_account)::text, s.amount)) AS m (account, amount)
    WHERE s.amount > 0
)
SELECT amount FROM settlement;

-- name: SettlementList :many
-- A client's settlements, oldest slot first.
SELECT slot, amount, operation_id FROM demo_settlement WHERE client = @client ORDER BY slot;
