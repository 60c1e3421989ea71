"""Admission's statements. `{journal}` in a statement is where its audit journal row goes (a
CTE written only if the CTE it names changed something), or nothing when the store has no
journal."""

from __future__ import annotations

__all__ = [
    "ADD_APPROVAL",
    "ADMIT",
    "APPROVALS_OF",
    "ADMIT_RECEIPT",
    "APPROVE",
    "COMMAND_COLUMNS",
    "INSERT_PROPOSAL",
    "KNOWN",
    "KNOWN_MANY",
    "MOVE_PROPOSAL",
    "PROPOSAL_ROW",
]

COMMAND_COLUMNS = (
    "request_hash, state, receipt, reason, decision_id::text AS decision_id, "
    "decision_line, policy_version, origin, operation_key, request_id"
)

INSERT_PROPOSAL = """
WITH recorded AS (
    INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent,
        action, action_version, arguments, request_hash, state, decision_id, reason,
        expected_revision, operation_key, request_id, public_id, preview, expires_at,
        traceparent, facts, facts_read_at, decision_line, policy_version, sealed)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12, $13, $14, $15, $16, $17,
            $18::jsonb, $19, $20, $21::jsonb, $22, $23, $24, $25)
    ON CONFLICT (tenant, proposal_id) DO NOTHING
    RETURNING public_id
){journal}
SELECT public_id FROM recorded
"""

# The reference architecture's admission in one statement: the proposal's pending -> executing
# claim, the command (ON CONFLICT DO NOTHING: RETURNING yields a row only for the first admission),
# its outbox row only if the command was created, and the relay's wake-up. $20 is the notification
# channel, $24 the policy epoch read before `decide` (NULL: the dispatcher's re-check asks again).
# `{receipt}`: the command's approval receipt (`ADMIT_RECEIPT`), with a receipt signer.
ADMIT = """
WITH proposal AS (
    INSERT INTO admission.proposals (tenant, proposal_id, run_id, step, principal, agent,
        action, action_version, arguments, request_hash, state, decision_id, reason,
        expected_revision, operation_key, request_id, public_id, preview)
    VALUES ($1, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, 'executing', $12, NULL, $16,
            $18, $19, $22, $23::jsonb)
    ON CONFLICT (tenant, proposal_id) DO UPDATE
        SET state = 'executing', decision_id = EXCLUDED.decision_id, updated_at = now()
        WHERE admission.proposals.state = 'pending'
    RETURNING 1
), admitted AS (
    INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, principal,
        agent, action, action_version, arguments, request_hash, decision_id, decision_line,
        policy_version, expires_at, expected_revision, origin, operation_key, request_id,
        preview, traceparent, policy_epoch)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $23::jsonb, $21, $24)
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING tenant, operation_id
), queued AS (
    INSERT INTO admission.outbox (tenant, operation_id, traceparent)
    SELECT tenant, operation_id, $21 FROM admitted
    RETURNING id
){journal}{receipt}
SELECT (SELECT id FROM queued) AS outbox_id,
       (SELECT count(*) FROM (SELECT pg_notify($20, '') FROM queued) AS woken) AS woken,
       (SELECT count(*) FROM proposal) AS claimed
"""


# The receipt of a command admitted on a decision's allow, signed before the statement (its
# claims are all in the statement's parameters) and stored in its transaction, so the relay signs
# nothing for it: $first..$first+2 are its key id, token and expiry (NULL token: its action has no
# provider request to sign). A proposal a person approved is left to the relay, which names them.
ADMIT_RECEIPT = """, signed AS (
    INSERT INTO admission.authorizations (tenant, operation_id, kid, token, expires_at)
    SELECT tenant, operation_id, ${kid}, ${token}, ${expires} FROM admitted
    WHERE ${token}::text IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM admission.proposals p
        WHERE p.tenant = $1 AND p.proposal_id = $3 AND p.approved_by IS NOT NULL)
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING 1
)"""


PROPOSAL_ROW = """
SELECT p.tenant, p.proposal_id::text AS proposal_id, p.public_id, p.run_id, p.step,
       p.principal, p.agent, p.action, p.action_version, p.arguments,
       coalesce(p.preview, '{}'::jsonb) AS preview, p.request_hash, p.state,
       p.decision_id::text AS decision_id, p.reason, p.expires_at, p.approved_by,
       p.expected_revision, p.operation_key, p.request_id, p.traceparent,
       c.operation_id::text AS operation_id, c.state AS command_state, c.receipt,
       c.reason AS command_reason, p.sealed
FROM admission.proposals p
LEFT JOIN admission.commands c ON c.tenant = p.tenant AND c.proposal_id = p.proposal_id
WHERE p.tenant = $1"""

# Approval by public id (the approval-contracts note): only a pending, unexpired proposal moves to
# executing, and only that move creates the command and its outbox row, from the proposal's frozen
# columns. $9 is the notification channel, $10 the admitting span's traceparent.
APPROVE = """
WITH claimed AS (
    UPDATE admission.proposals
    SET state = 'executing', approved_by = $3, approved_at = now(), decision_id = $4,
        updated_at = now()
    WHERE tenant = $1 AND proposal_id = $2 AND state = 'pending' AND expires_at > now()
    RETURNING *
), admitted AS (
    INSERT INTO admission.commands (tenant, operation_id, proposal_id, run_id, step, principal,
        agent, action, action_version, arguments, request_hash, decision_id, decision_line,
        policy_version, expires_at, expected_revision, origin, operation_key, request_id,
        preview, traceparent)
    SELECT tenant, $8, proposal_id, run_id, step, principal, agent, action, action_version,
           CASE WHEN sealed IS NULL THEN arguments ELSE $11::jsonb END, request_hash, $4, $5,
           $6, $7, expected_revision,
           CASE WHEN operation_key IS NULL THEN 'run' ELSE 'host' END, operation_key,
           request_id, CASE WHEN sealed IS NULL THEN preview ELSE $12::jsonb END, $10
    FROM claimed
    ON CONFLICT (tenant, operation_id) DO NOTHING
    RETURNING tenant, operation_id
), queued AS (
    INSERT INTO admission.outbox (tenant, operation_id, traceparent)
    SELECT tenant, operation_id, $10 FROM admitted
    RETURNING id
){journal}
SELECT (SELECT count(*) FROM claimed) = 1
       AND (SELECT count(*) FROM (SELECT pg_notify($9, '') FROM queued) AS woken) = 1
"""


MOVE_PROPOSAL = """
WITH moved AS (
    UPDATE admission.proposals SET state = $3, reason = $4, updated_at = now()
    WHERE tenant = $1 AND proposal_id = $2 AND state = 'pending' {condition}
    RETURNING 1
){journal}
SELECT count(*) FROM moved
"""


# With the governance policy epoch as it stands before `decide` is asked (see `known`).
KNOWN = f"""
SELECT c.*, p.state AS proposal_state, p.decision_id::text AS proposal_decision_id,
       coalesce(p.reason, '') AS proposal_reason,
       (SELECT epoch FROM governance.policy_epoch) AS policy_epoch
FROM (SELECT 1) AS one
LEFT JOIN (SELECT {COMMAND_COLUMNS} FROM admission.commands
           WHERE tenant = $1 AND operation_id = $2) AS c ON true
LEFT JOIN admission.proposals p ON p.tenant = $1 AND p.proposal_id = $3
"""


KNOWN_MANY = f"""
SELECT c.*, p.state AS proposal_state, p.decision_id::text AS proposal_decision_id,
       coalesce(p.reason, '') AS proposal_reason,
       (SELECT epoch FROM governance.policy_epoch) AS policy_epoch
FROM unnest($1::text[], $2::uuid[], $3::uuid[]) WITH ORDINALITY AS k(tenant, operation_id,
                                                                       proposal_id, i)
LEFT JOIN LATERAL (SELECT {COMMAND_COLUMNS} FROM admission.commands
                   WHERE tenant = k.tenant AND operation_id = k.operation_id) AS c ON true
LEFT JOIN admission.proposals p ON p.tenant = k.tenant AND p.proposal_id = k.proposal_id
ORDER BY k.i
"""


# A proposal's approvals, first first, each with why it no longer counts (NULL: it counts), as
# governance's `approval_void` says: the one rule, for counting them and for listing them.
# A JSON array of {approver, approved_at, void}; `{proposal}` is the proposal's table alias.
APPROVALS_OF = """coalesce((
    SELECT jsonb_agg(jsonb_build_object(
               'approver', a.approver, 'approved_at', a.approved_at,
               'void', governance.approval_void(a.tenant, a.approver))
           ORDER BY a.approved_at, a.approver)
    FROM admission.proposal_approvals a
    WHERE a.tenant = {proposal}.tenant AND a.proposal_id = {proposal}.proposal_id), '[]')"""


# One approval of a proposal that needs two distinct approvers: only while it is pending.
ADD_APPROVAL = """
WITH added AS (
    INSERT INTO admission.proposal_approvals (tenant, proposal_id, approver)
    SELECT tenant, proposal_id, $3 FROM admission.proposals
    WHERE tenant = $1 AND proposal_id = $2 AND state = 'pending'
    ON CONFLICT DO NOTHING
    RETURNING 1
){journal}
SELECT count(*) FROM added
"""
