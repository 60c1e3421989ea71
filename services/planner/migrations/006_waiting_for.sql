-- The pending decision a stopped run waits for, when it is a read governance asked a person
-- about: only the answer to exactly that decision resumes the run (an older answer delivered
-- again, or one about another call, does not).
ALTER TABLE planner.runs ADD COLUMN pending_id text;
