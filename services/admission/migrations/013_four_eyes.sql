-- Four eyes: the approvals a proposal has gathered while it waits for the distinct approvers
-- its contract asks for. One row per person: approving twice adds nothing.
CREATE TABLE admission.proposal_approvals (
    tenant      text        NOT NULL,
    proposal_id uuid        NOT NULL,
    approver    text        NOT NULL,
    approved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, proposal_id, approver),
    FOREIGN KEY (tenant, proposal_id) REFERENCES admission.proposals (tenant, proposal_id)
        ON DELETE CASCADE
);
GRANT SELECT, INSERT ON admission.proposal_approvals TO {role:admission};
