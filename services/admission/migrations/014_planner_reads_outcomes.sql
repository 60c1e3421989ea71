-- The planner's sweeper reads what became of a stalled run's command (`services/planner/
-- sweeper.py`): an outcome the bus lost is re-driven from here. Read-only, and only the
-- columns an outcome message carries.
GRANT USAGE ON SCHEMA admission TO {role:planner};
GRANT SELECT (tenant, operation_id, run_id, step, action, state, receipt, reason)
    ON admission.commands TO {role:planner};
