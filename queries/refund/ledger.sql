-- name: LedgerMove :exec
-- Moves amount from one account to another: two entries of one move, in one
-- statement, that sum to zero. A refund's moves are written with the refund
-- (RefundRecord, RefundFail).
INSERT INTO demo_ledger_entry (client, move_id, account, amount, kind, order_id)
VALUES (@client, @move_id, sqlc.arg(from_account)::text, 0 - sqlc.arg(amount)::bigint, @kind, @order_id),
       (@client, @move_id, sqlc.arg(to_account)::text, sqlc.arg(amount)::bigint, @kind, @order_id);

-- name: LedgerBalances :many
-- A client's accounts and their balances, in byte order of the account name.
SELECT account, sum(amount)::bigint AS balance
FROM demo_ledger_entry
WHERE client = @client
GROUP BY account
ORDER BY account COLLATE "C";
