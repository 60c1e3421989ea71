-- What a host sees of a run (its status, answer, error and pending decision) is counted on
-- the run's row: each change adds one (`PlannerStore.set_status`). The count is the
-- `version` of the run's `RunResult` and `RunView`, so a host waiting for news passes the
-- version it has seen and is answered only with a newer one.
ALTER TABLE planner.runs ADD COLUMN state_version bigint NOT NULL DEFAULT 0;
