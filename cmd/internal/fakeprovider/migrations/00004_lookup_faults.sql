-- The faults of the lookup by key: "lookup_error" (the next lookups answer
-- 503; refund POSTs take no injection of it) and "lagging_lookup" (a refund
-- POST is carried out and its answer lost, and the lookup under its key does
-- not find it until lookup_after, as a provider's search index that lags
-- behind its records; the list shows it at once).
ALTER TABLE provider.fault
    DROP CONSTRAINT fault_mode_check,
    ADD CONSTRAINT fault_mode_check CHECK (mode IN ('error', 'lost_response', 'slow', 'pending', 'lookup_error', 'lagging_lookup'));

-- When the lookup under the refund's key begins to find it, by the database's
-- clock; null: at once.
ALTER TABLE provider.refund ADD COLUMN lookup_after timestamptz;

---- create above / drop below ----
ALTER TABLE provider.refund DROP COLUMN lookup_after;
DELETE FROM provider.fault WHERE mode IN ('lookup_error', 'lagging_lookup');
ALTER TABLE provider.fault
    DROP CONSTRAINT fault_mode_check,
    ADD CONSTRAINT fault_mode_check CHECK (mode IN ('error', 'lost_response', 'slow', 'pending'));
