-- The planner's sweeper reads the answer a waiting run's person gave (`services/planner/
-- sweeper.py`): an answer whose announcement the bus lost is re-driven from here. Read-only,
-- and only the columns the announcement carries. Granted where the planner has a role in this
-- database (every deployment; not a database of governance's alone).
DO $grant$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE '"' || rolname || '"' = '{role:planner}') THEN
        GRANT USAGE ON SCHEMA governance TO {role:planner};
        GRANT SELECT (pending_id, tenant, run_id, proposal_id, answer, answered_by,
                      answer_reason, answer_decision_id)
            ON governance.pending TO {role:planner};
        GRANT SELECT (decision_id, line, policy_version)
            ON governance.decisions TO {role:planner};
    END IF;
END
$grant$;
