-- A proposal's arguments, preview and the facts it was resolved against, sealed under its
-- run's journal window key (libs/journal/_sealed.py, docs/retention.md) when it is recorded
-- without becoming a command (refused, or waiting for a person): the retention policy's expiry
-- and a principal's erasure reach them with the journal's copy. Rows recorded before stay in
-- the plain columns; sealed rows keep `arguments` `{}` and `preview`, `facts` NULL.
ALTER TABLE admission.proposals ADD COLUMN sealed bytea;
