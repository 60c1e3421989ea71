-- The planner's sweeper reads what admission answered a stalled run's proposal that did not
-- become a command (`services/planner/sweeper.py`): a refusal (a policy's deny, a person's
-- rejection or request for a revision, an expiry) or an ask whose message the bus lost is
-- re-driven from here. Read-only, through a view of what a refusal message carries, its verdict
-- told from the record as admission tells it when a proposal is sent again; a proposal's
-- arguments, principal and facts are not in it.
CREATE VIEW admission.refusals AS
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
WHERE state IN ('pending', 'rejected', 'expired');
-- The sweeper looks a run's proposal up by its run and step.
CREATE INDEX proposals_by_run ON admission.proposals (run_id, step);
GRANT SELECT ON admission.refusals TO {role:planner};
