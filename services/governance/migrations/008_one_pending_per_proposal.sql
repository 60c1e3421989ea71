-- One open pending decision per proposal: the same operation key sent
-- concurrently was decided by several admissions at once, each ask recording its own pending
-- decision, and all but one were orphans nobody could answer usefully. Governance records an
-- ask for a proposal that already waits as that same pending decision.
-- Orphans recorded before this index: the oldest stays open, the others are closed as denied.
UPDATE governance.pending p
   SET answer = 'deny', answered_by = 'writ', answered_at = now(),
       answer_reason = 'a duplicate of an earlier pending decision about the same proposal'
 WHERE p.answer IS NULL AND p.proposal_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM governance.pending q
                WHERE q.tenant = p.tenant AND q.proposal_id = p.proposal_id
                  AND q.answer IS NULL
                  AND (q.created_at, q.pending_id) < (p.created_at, p.pending_id));
CREATE UNIQUE INDEX pending_one_open_per_proposal ON governance.pending (tenant, proposal_id)
    WHERE proposal_id IS NOT NULL AND answer IS NULL;
