-- Admission owns proposals, the command registry and the outbox (the reference architecture).
CREATE SCHEMA admission;

CREATE TABLE admission.proposals (
    tenant        text NOT NULL,
    proposal_id   uuid NOT NULL,
    run_id        text NOT NULL,
    step          int NOT NULL,
    principal     text NOT NULL,
    agent         text NOT NULL,
    action        text NOT NULL,
    action_version int NOT NULL,
    arguments     jsonb NOT NULL,
    request_hash  bytea NOT NULL,
    state         text NOT NULL CHECK (state IN
                  ('pending', 'executing', 'completed', 'rejected', 'expired')),
    decision_id   uuid,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, proposal_id)
);

CREATE TABLE admission.commands (
    tenant            text NOT NULL,
    operation_id      uuid NOT NULL,
    proposal_id       uuid NOT NULL,
    run_id            text NOT NULL,
    step              int NOT NULL,
    principal         text NOT NULL,
    agent             text NOT NULL,
    action            text NOT NULL,
    action_version    int NOT NULL,
    arguments         jsonb NOT NULL,
    request_hash      bytea NOT NULL,
    decision_id       uuid NOT NULL,
    decision_line     int NOT NULL,
    policy_version    text NOT NULL,
    expires_at        timestamptz NOT NULL,
    expected_revision text,
    -- The command's state columns: the only ones the dispatcher may update.
    state             text NOT NULL DEFAULT 'pending' CHECK (state IN (
                      'pending', 'dispatching', 'succeeded', 'denied', 'expired',
                      'revision_required', 'unknown', 'failed')),
    lease_epoch       bigint NOT NULL DEFAULT 0,
    lease_owner       text,
    lease_until       timestamptz,
    receipt           text,
    reason            text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, operation_id),
    FOREIGN KEY (tenant, proposal_id) REFERENCES admission.proposals (tenant, proposal_id)
);
CREATE INDEX commands_by_run ON admission.commands (run_id);
CREATE INDEX commands_expired_leases ON admission.commands (lease_until)
    WHERE state = 'dispatching';

CREATE TABLE admission.outbox (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant        text NOT NULL,
    operation_id  uuid NOT NULL,
    available_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, operation_id),
    FOREIGN KEY (tenant, operation_id) REFERENCES admission.commands (tenant, operation_id)
);

GRANT USAGE ON SCHEMA admission TO {role:admission};
GRANT SELECT, INSERT, UPDATE ON admission.proposals TO {role:admission};
GRANT SELECT, INSERT ON admission.commands TO {role:admission};
-- UPDATE only because the relay claims rows with FOR UPDATE SKIP LOCKED.
GRANT SELECT, INSERT, UPDATE, DELETE ON admission.outbox TO {role:admission};

-- The dispatcher reads commands and moves their state; it can never change what was approved.
GRANT USAGE ON SCHEMA admission TO {role:dispatcher};
GRANT SELECT ON admission.commands TO {role:dispatcher};
GRANT UPDATE (state, lease_epoch, lease_owner, lease_until, receipt, reason, updated_at)
    ON admission.commands TO {role:dispatcher};
