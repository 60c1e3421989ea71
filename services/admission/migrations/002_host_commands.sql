-- Hosts may submit commands directly under their own operation key (no run, no planner).
-- `origin` says who to answer; `request_id` is the submission the final outcome answers.
ALTER TABLE admission.commands
    ADD COLUMN origin        text NOT NULL DEFAULT 'run' CHECK (origin IN ('run', 'host')),
    ADD COLUMN operation_key text,
    ADD COLUMN request_id    text;

-- Reconciliation of `unknown` commands: who established what, from which evidence.
CREATE TABLE admission.reconciliations (
    tenant        text NOT NULL,
    operation_id  uuid NOT NULL,
    resolved_state text NOT NULL CHECK (resolved_state IN ('succeeded', 'failed')),
    receipt       text,
    evidence      text NOT NULL,
    resolved_by   text NOT NULL,
    resolved_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, operation_id),
    FOREIGN KEY (tenant, operation_id) REFERENCES admission.commands (tenant, operation_id)
);
GRANT SELECT ON admission.reconciliations TO {role:admission};
-- Reconciliation moves a command's state, which is the dispatcher's to move.
GRANT SELECT, INSERT ON admission.reconciliations TO {role:dispatcher};
