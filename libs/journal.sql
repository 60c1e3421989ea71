-- The audit journal's tables (docs/design.md §3 invariant 10, §7), the same in every service that
-- keeps one: a service's migration includes this file (libs/db.py, load_migrations), in the
-- service's own schema. libs/journal.py writes, seals and verifies. Rows are insert-only for the
-- service role: it can neither edit nor delete its own history, and what an administrator
-- edits, `writ audit verify` finds.
CREATE TABLE {schema}.journal (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writer's transaction id: the sealer chains rows in (xid, id) order once xid is below
    -- every snapshot's xmin, so no row can commit behind the head of the chain.
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    tenant      text NOT NULL,
    kind        text NOT NULL,
    subject     text NOT NULL,
    run_id      text NOT NULL DEFAULT '',
    recorded_at timestamptz NOT NULL DEFAULT now(),
    key_id      text NOT NULL,      -- the AES-GCM data key
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL      -- the msgspec-encoded event, encrypted
);
CREATE INDEX journal_chain_order ON {schema}.journal (xid, id);

-- The chain: one seal per row, seq contiguous from 1.
CREATE TABLE {schema}.journal_seals (
    seq         bigint PRIMARY KEY,
    entry_id    bigint NOT NULL UNIQUE,
    xid         xid8 NOT NULL,
    prev_hash   bytea NOT NULL,
    entry_hash  bytea NOT NULL,
    sealed_at   timestamptz NOT NULL DEFAULT now()
);

-- One Ed25519-signed checkpoint per sealed batch over (service, seq, prev_seq, head hash).
CREATE TABLE {schema}.journal_checkpoints (
    seq         bigint PRIMARY KEY,
    prev_seq    bigint NOT NULL,
    head_hash   bytea NOT NULL,
    key_id      text NOT NULL,
    signature   bytea NOT NULL,
    signed_at   timestamptz NOT NULL DEFAULT now()
);

GRANT SELECT, INSERT ON {schema}.journal, {schema}.journal_seals,
    {schema}.journal_checkpoints TO {role:{schema}};
