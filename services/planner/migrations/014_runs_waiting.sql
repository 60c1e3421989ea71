-- The sessions' sweep looks for turns still waiting on a plan their user answered, or on a
-- resume their session had (`SessionTurns.wake_answered`): a wake lost to a crash is found
-- in a second. The runs waiting are few; this keeps the look from reading every run.
CREATE INDEX runs_waiting ON planner.runs (run_id) WHERE status = 'awaiting_human';
