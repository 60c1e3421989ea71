-- The dispatcher records every attempt it makes, one row each (the reference architecture).
CREATE SCHEMA dispatcher;

CREATE TABLE dispatcher.attempts (
    attempt_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant        text NOT NULL,
    operation_id  uuid NOT NULL,
    lease_epoch   bigint NOT NULL,
    worker        text NOT NULL,
    connector     text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    result        text CHECK (result IN
                  ('succeeded', 'failed', 'transient', 'lost', 'revision_required')),
    detail        text,
    UNIQUE (tenant, operation_id, lease_epoch)
);

GRANT USAGE ON SCHEMA dispatcher TO {role:dispatcher};
GRANT SELECT, INSERT, UPDATE ON dispatcher.attempts TO {role:dispatcher};
