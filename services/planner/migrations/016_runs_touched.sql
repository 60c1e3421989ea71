-- When a transaction last locked the run (`PlannerStore.locked` sets it with the count): a
-- running run nobody locked for a while waits on a message the bus may have lost, and the
-- planner's sweeper drives it again from here (`sweeper.py`). The running runs are few; the
-- index keeps the sweeper's look from reading every run, and it leaves `touched_at` out so
-- the lock's update stays a heap-only one.
ALTER TABLE planner.runs ADD COLUMN touched_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX runs_running ON planner.runs (run_id) WHERE status = 'running';
