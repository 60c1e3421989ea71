-- The org policy is loaded from signed files by governance itself; a refused file is recorded
-- as such and makes every sensitive call a denial for that tenant.
ALTER TABLE governance.policy
    ADD COLUMN developer_mode boolean NOT NULL DEFAULT false,
    ADD COLUMN status         text NOT NULL DEFAULT 'valid' CHECK (status IN ('valid', 'refused')),
    ADD COLUMN refusal        text,
    ADD COLUMN key_id         text,
    ADD COLUMN digest         text;
GRANT INSERT, UPDATE, DELETE ON governance.policy TO {role:governance};

-- Runs as ingress registered them: only a verified host says whether a person is watching and
-- which families it grants for the run.
CREATE TABLE governance.runs (
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    principal   text NOT NULL,
    agent       text NOT NULL,
    attended    boolean NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, run_id)
);
CREATE TABLE governance.run_grants (
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    family      text NOT NULL CHECK (family IN
                ('read', 'read_personal', 'write_delete', 'send_external', 'execute_code')),
    granted_by  text NOT NULL,
    PRIMARY KEY (tenant, run_id, family),
    FOREIGN KEY (tenant, run_id) REFERENCES governance.runs (tenant, run_id)
);

-- Decisions waiting for a person. The pending id is the asking decision's id. An attended ask
-- has a deadline (5 minutes, fixed): unanswered by then, it is a deny.
CREATE TABLE governance.pending (
    pending_id     uuid PRIMARY KEY REFERENCES governance.decisions (decision_id),
    tenant         text NOT NULL,
    run_id         text NOT NULL,
    proposal_id    text,
    agent          text NOT NULL,
    principal      text NOT NULL,
    tool           text NOT NULL,
    family         text NOT NULL,
    first_argument text NOT NULL,
    reason         text NOT NULL,
    options        text[] NOT NULL,
    attended       boolean NOT NULL,
    deadline       timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    answer         text CHECK (answer IN ('once', 'always', 'deny')),
    answered_by    text,
    answered_at    timestamptz,
    answer_reason  text,
    answer_decision_id uuid
);
CREATE INDEX pending_open ON governance.pending (tenant, created_at) WHERE answer IS NULL;
CREATE INDEX pending_deadline ON governance.pending (deadline) WHERE answer IS NULL;

GRANT SELECT, INSERT ON governance.runs, governance.run_grants TO {role:governance};
GRANT SELECT, INSERT, UPDATE ON governance.pending TO {role:governance};
-- "always" on a narrow code command writes exactly that fine rule.
GRANT INSERT ON governance.rules TO {role:governance};
