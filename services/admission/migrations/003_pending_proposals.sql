-- A proposal waiting for a person must hold everything needed to admit it later, exactly as it
-- was shown: the host's key and request, and the expected revision, frozen with the arguments.
ALTER TABLE admission.proposals
    ADD COLUMN expected_revision text,
    ADD COLUMN operation_key     text,
    ADD COLUMN request_id        text;
CREATE INDEX proposals_pending ON admission.proposals (tenant, decision_id) WHERE state = 'pending';
