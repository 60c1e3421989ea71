-- A run's proposal admission refused as invalid (it does not fit its action's contract, names a
-- resource the tenant does not have, or no longer matches the plan a person approved) is
-- recorded, so the planner's sweeper can re-drive that refusal when the bus lost its message:
-- a proposal sent again gets the same refusal, whose message id the stream would drop as a
-- duplicate of the lost one. What the refusal message carried, nothing of the arguments.
CREATE TABLE admission.invalid_proposals (
    tenant      text NOT NULL,
    run_id      text NOT NULL,
    step        int NOT NULL,
    action      text NOT NULL,
    reason      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, run_id, step)
);
GRANT SELECT, INSERT ON admission.invalid_proposals TO {role:admission};

-- The refusals the planner reads (018): those of recorded proposals, and the invalid ones.
CREATE OR REPLACE VIEW admission.refusals AS
SELECT tenant, proposal_id, run_id, step, action, state,
       CASE
           WHEN state = 'pending' THEN 'ask'
           WHEN state = 'expired' THEN 'rejected'
           WHEN reason LIKE 'rejected by%' THEN 'rejected'
           WHEN reason LIKE 'revision asked by%' THEN 'revise'
           ELSE 'deny'
       END AS verdict,
       coalesce(reason, '') AS reason, decision_id, public_id, preview, expires_at
FROM admission.proposals
WHERE state IN ('pending', 'rejected', 'expired')
UNION ALL
SELECT tenant, NULL::uuid, run_id, step, action, 'invalid', 'invalid', reason, NULL::uuid,
       NULL::text, NULL::jsonb, NULL::timestamptz
FROM admission.invalid_proposals;
