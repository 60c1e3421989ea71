-- Plan-mode (docs/design.md §6): a chat turn first proposes a plan — its ordered steps, each the
-- capability it will use and the arguments it will use it with — frozen and hashed, answered by
-- its opaque id only. Approving is consent to proceed, not an authorisation: every call is still
-- decided by governance where it is made.
CREATE TABLE planner.plans (
    plan_id     text PRIMARY KEY,
    session_id  text NOT NULL REFERENCES planner.sessions (session_id),
    tenant      text NOT NULL,
    turn        int NOT NULL,
    run_id      text NOT NULL,
    step        int NOT NULL,  -- the decision that ended the planning
    state       text NOT NULL CHECK (state IN ('proposed', 'approved', 'rejected', 'superseded')),
    digest      text NOT NULL,  -- sha256 of the canonical steps
    steps       jsonb NOT NULL,
    reason      text NOT NULL DEFAULT '',
    answered_by text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (run_id, step)
);
GRANT SELECT, INSERT, UPDATE ON planner.plans TO {role:planner};
