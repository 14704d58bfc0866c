-- receipt: the receipt number that version 2 of the refund operation gives a
-- succeeded refund (its receipt step); null for refunds of version 1.
ALTER TABLE demo_refund ADD COLUMN receipt text;

---- create above / drop below ----
ALTER TABLE demo_refund DROP COLUMN receipt;
