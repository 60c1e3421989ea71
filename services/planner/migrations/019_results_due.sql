-- A run that ended owes its host (or the run that called it) one result message, published
-- after the transaction that ended it commits. `result_due` is set by that transaction and
-- cleared once the message is out: a planner gone in between, with no delivery to repeat it
-- (the run was driven by a sweep, or its message was deleted), leaves the flag, and the
-- planner's sweeper publishes the result again from the run's row (`sweeper.py`). Rows ended
-- before keep `false`. The index holds only the few runs whose result is not out yet.
ALTER TABLE planner.runs ADD COLUMN result_due boolean NOT NULL DEFAULT false;
CREATE INDEX runs_result_due ON planner.runs (run_id) WHERE result_due;
