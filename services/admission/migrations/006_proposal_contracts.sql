-- Proposals are durable application state (the approval-contracts note): an opaque public id, the preview a person
-- reads frozen with the arguments, an expiry, and who approved it when. The command carries its
-- preview too: the dispatcher's revalidation proves what the preview claimed still holds.
ALTER TABLE admission.proposals
    ADD COLUMN public_id   text,
    ADD COLUMN preview     jsonb,
    ADD COLUMN expires_at  timestamptz,
    ADD COLUMN approved_by text,
    ADD COLUMN approved_at timestamptz;
CREATE UNIQUE INDEX proposals_public_id ON admission.proposals (tenant, public_id);
ALTER TABLE admission.commands ADD COLUMN preview jsonb;
