-- The facts each proposal was resolved against, whatever governance then ruled (allowed,
-- asked or denied): what `writ eval build` resolves a recorded decision against, so a set
-- built from the journal judges a selection (and its plan trigger) without a hand-made facts
-- file. One row per proposal, written before the proposal's verdict is recorded; a proposal
-- resolved again (a redelivery before any verdict committed) keeps its last resolution, the
-- one its verdict stands on. The auditor's read-only role may read this table and, of
-- admission, nothing else but the journal (`libs.journal.AUDITOR_TABLES`). Execution never
-- reads it.
CREATE TABLE admission.resolved_facts (
    tenant        text NOT NULL,
    proposal_id   uuid NOT NULL,
    run_id        text NOT NULL,
    step          int NOT NULL,
    action        text NOT NULL,
    facts_kind    text NOT NULL,
    facts_id      text NOT NULL,
    facts         jsonb NOT NULL,
    read_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant, proposal_id)
);
CREATE INDEX resolved_facts_by_run ON admission.resolved_facts (tenant, run_id, step);

GRANT SELECT, INSERT, UPDATE ON admission.resolved_facts TO {role:admission};
