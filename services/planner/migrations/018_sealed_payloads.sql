-- A run's input and the evidence it was given, sealed under the run's journal window key
-- (libs/journal/_sealed.py, docs/retention.md): the retention policy's expiry and a
-- principal's erasure reach them with the journal's copy. Rows written before stay in the
-- plain columns until they are deleted; new rows keep `input` empty and `evidence` `[]`.
ALTER TABLE planner.runs ADD COLUMN sealed bytea;
-- A chat turn's input (the bounded conversation, as user data), sealed the same way.
ALTER TABLE planner.session_turns ADD COLUMN sealed bytea;
-- A chat session's events (its messages, the model's answers), sealed under the session's
-- window key; sealed rows keep `body` `{}`.
ALTER TABLE planner.session_events ADD COLUMN sealed bytea;
