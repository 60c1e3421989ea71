-- The trace a proposal and a command were made in, so the work that resumes them later (a
-- person's approval, the sweeper re-driving a command the bus lost) starts its own trace with
-- a span link back to it.
ALTER TABLE admission.proposals ADD COLUMN traceparent text;
ALTER TABLE admission.commands ADD COLUMN traceparent text;
