-- The agent each run started with: its manifest version, responsibility and the
-- catalog its model may see, kept with the run so a resumed run and the offline replay use the
-- very catalog the model saw, whatever the manifests say later. NULL: a run from before
-- manifests, or for an agent no manifest declares (that run fails at once).
ALTER TABLE planner.runs ADD COLUMN manifest jsonb;
