-- Admission's sweeper reads the answer governance recorded to a decision about a proposal
-- (`services/admission/sweeper.py`): an answer admission never acted on (its announcement lost,
-- or admission gone between governance's answer and its own claim) is re-driven from here.
-- Read-only, and only the columns the announcement carries, with when it was answered.
DO $grant$
BEGIN
    IF to_regrole('{role:admission}') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA governance TO {role:admission};
        GRANT SELECT (pending_id, tenant, run_id, proposal_id, answer, answered_by,
                      answered_at, answer_reason, answer_decision_id)
            ON governance.pending TO {role:admission};
        GRANT SELECT (decision_id, line, policy_version)
            ON governance.decisions TO {role:admission};
    END IF;
END
$grant$;
