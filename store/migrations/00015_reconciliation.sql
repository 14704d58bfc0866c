-- Reconciliation: the outside services' records checked against the steps.
--
-- Derived keys of scheme 3 ("idf3_") carry their operation's id, so that a
-- record at a provider leads to its operation without an index of keys. Their
-- operations' secrets are 17 bytes (a scheme byte, 3, then 16 random ones);
-- older operations keep their 16 and their "idf2_" keys. The column is renamed
-- so that a binary from before this migration, which names key_secret in every
-- statement that reserves or reads an operation, fails them all rather than
-- resume an operation of scheme 3 under a key of scheme 2: a new request, and
-- a second refund, at the provider.
ALTER TABLE idemflow_operation RENAME COLUMN key_secret TO key_seed;
--
-- idemflow_mismatch holds what the last runs found, one row per record of a
-- source, by its key and reference (a service may hold several records under
-- one key, or records under none: made by hand); the kind says what is wrong:
-- a run upserts what it finds (last_seen) and deletes, as it ends, what it did
-- not see again. operation_id names the operation whose step holds the key,
-- null for a key no operation holds; no foreign key, so that the retention job
-- deletes operations as before (a later run reports their records as
-- unknown_key if they still differ).
CREATE TABLE idemflow_mismatch (
    source            text        NOT NULL,
    record_key        text        NOT NULL,
    kind              text        NOT NULL CHECK (kind <> ''),
    reference         text        NOT NULL,
    amount            bigint      NOT NULL,
    record_status     text        NOT NULL,
    record_created_at timestamptz NOT NULL,
    data              jsonb,
    operation_id      uuid,
    step              text,
    detail            text        NOT NULL,
    first_seen        timestamptz NOT NULL DEFAULT now(),
    last_seen         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, record_key, reference)
);
CREATE INDEX idemflow_mismatch_operation ON idemflow_mismatch (operation_id) WHERE operation_id IS NOT NULL;

-- The last finished run of each source: what GET-style reports show.
CREATE TABLE idemflow_reconciliation (
    source       text        PRIMARY KEY,
    started_at   timestamptz NOT NULL,
    checked_at   timestamptz NOT NULL,
    window_start timestamptz NOT NULL,
    checked      bigint      NOT NULL,
    not_yet      bigint      NOT NULL,
    unverifiable bigint      NOT NULL,
    pages        integer     NOT NULL
);

---- create above / drop below ----

DROP TABLE idemflow_reconciliation;
DROP TABLE idemflow_mismatch;
-- A binary from before would resume these under keys of scheme 2.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM idemflow_operation WHERE state = 'in_progress' AND length(key_seed) <> 16) THEN
        RAISE EXCEPTION 'unfinished operations have derived keys of scheme 3, which binaries before this migration cannot compute: finish them first';
    END IF;
END $$;
ALTER TABLE idemflow_operation RENAME COLUMN key_seed TO key_secret;
