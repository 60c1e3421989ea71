-- Whether a person watches the run: an unattended run stops at its first ask and tells the
-- host; an attended one waits for the answer.
ALTER TABLE planner.runs ADD COLUMN attended boolean NOT NULL DEFAULT false;
