-- The planner owns runs and their steps: every model decision is captured, so a resumed run
-- reuses what the model said instead of asking again (docs/design.md invariant 3).
CREATE SCHEMA planner;

CREATE TABLE planner.runs (
    run_id        text PRIMARY KEY,
    tenant        text NOT NULL,
    request_id    text NOT NULL,
    principal     text NOT NULL,
    agent         text NOT NULL,
    input         text NOT NULL,
    evidence      jsonb NOT NULL,
    status        text NOT NULL CHECK (status IN
                  ('queued', 'running', 'awaiting_human', 'succeeded', 'failed', 'cancelled')),
    answer        text,
    error_code    text,
    error_message text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, request_id)
);

CREATE TABLE planner.steps (
    run_id        text NOT NULL REFERENCES planner.runs (run_id),
    seq           int NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('decision', 'observation')),
    payload       jsonb NOT NULL,
    input_digest  text,           -- sha256 of the model input a decision answered
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

GRANT USAGE ON SCHEMA planner TO {role:planner};
GRANT SELECT, INSERT, UPDATE ON planner.runs TO {role:planner};
GRANT SELECT, INSERT ON planner.steps TO {role:planner};
