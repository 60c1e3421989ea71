-- What an approver reads beside the preview (the approval console): the facts the preview was
-- computed from and when they were read, and the decision that asked for a person (the line
-- of `decide` and the policy version it read). Display only: execution never reads them.
ALTER TABLE admission.proposals
    ADD COLUMN facts          jsonb,
    ADD COLUMN facts_read_at  timestamptz,
    ADD COLUMN decision_line  int,
    ADD COLUMN policy_version text;
