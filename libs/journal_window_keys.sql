-- The audit journal's window keys (libs/journal/_window.py, docs/retention.md): one AES-256-GCM
-- key per tenant, UTC day and run, wrapped under the service's data key file. Every journal
-- payload is encrypted under one. The retention policy and a principal's erasure destroy keys
-- (the row stays, its wrapped bytes gone): that erases the payloads while every row keeps its
-- place and hash in the signed chain. The service role makes keys and never destroys one.
CREATE TABLE IF NOT EXISTS {schema}.journal_window_keys (
    key_id       text PRIMARY KEY,
    tenant       text NOT NULL,
    day          date NOT NULL,
    run_id       text NOT NULL DEFAULT '',
    wrap_key_id  text NOT NULL,
    nonce        bytea,
    wrapped      bytea,
    created_at   timestamptz NOT NULL DEFAULT now(),
    destroyed_at timestamptz,
    destroyed_by text,
    reason       text,
    CHECK ((wrapped IS NULL) = (destroyed_at IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS journal_window_keys_day ON {schema}.journal_window_keys (tenant, day);
CREATE INDEX IF NOT EXISTS journal_window_keys_run
    ON {schema}.journal_window_keys (tenant, run_id);
GRANT SELECT, INSERT ON {schema}.journal_window_keys TO {role:{schema}};
