-- Each transaction that locks a run counts itself on the run's row (`PlannerStore.locked`):
-- the statement that locks a run and reads its state in one round trip compares the count
-- its snapshot saw with the one it locked, and reads the state again when another planner
-- committed in between.
ALTER TABLE planner.runs ADD COLUMN version bigint NOT NULL DEFAULT 0;
