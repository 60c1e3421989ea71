"""The runs the planner's sweeper drives again, not locked by anyone for a while (`touched_at`,
set by every transaction that locks a run): running ones, and those waiting for a person whose
answer is recorded (governance's answer to the read it asked about, the outcome of the
command its approved proposal became, or admission's record that the proposal was refused);
what became of the command a stalled run's last decision proposed, read from admission's
registry, or what admission answered a proposal that did not become one (its refusals); and
the answer a waiting run's person gave, read from governance's (all granted read-only)."""

from __future__ import annotations

from typing import Final

import asyncpg
import msgspec

from schemas.admission import ProposalRefused
from schemas.governance import DecisionAnswered

__all__ = [
    "LastCommand",
    "claim_answered",
    "claim_ended",
    "claim_stalled",
    "last_command",
    "last_refusal",
    "pending_answer",
    "results_sent",
]

# Claims them in one statement: a run locked now (a delivery driving it) is skipped, and a
# claimed one is touched, so another planner's sweep passes it by until it stalls again.
_CLAIM: Final = """
UPDATE planner.runs AS r SET touched_at = now()
FROM (
    SELECT run_id FROM planner.runs
    WHERE status = 'running' AND touched_at < now() - make_interval(secs => $1)
    ORDER BY touched_at LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS s
WHERE r.run_id = s.run_id
RETURNING r.tenant, r.run_id"""
# The runs waiting for a person whose answer the database holds: an answer governance recorded
# to the very decision the run waits on (a read's: a proposal's answer becomes a command), or
# the outcome of the command the run's last step proposed, or admission's refusal of that
# step's proposal (a person rejected it, asked for a revision, or let it expire). Its
# announcement was lost, or is late: the sweep delivers it in-process, and whichever comes
# first is taken once (the run's row lock; an answer to a run no longer waiting changes
# nothing). Claimed as `_CLAIM` does.
_CLAIM_ANSWERED: Final = """
UPDATE planner.runs AS r SET touched_at = now()
FROM (
    SELECT q.run_id FROM planner.runs q
    WHERE q.status = 'awaiting_human' AND q.touched_at < now() - make_interval(secs => $1)
      AND (
        EXISTS (
            SELECT 1 FROM governance.pending p
            WHERE p.pending_id = CASE WHEN q.pending_id ~ '^[0-9a-f-]{36}$'
                                      THEN q.pending_id::uuid END
              AND p.tenant = q.tenant AND p.answer IS NOT NULL AND p.proposal_id IS NULL)
        OR EXISTS (
            SELECT 1 FROM admission.commands c
            WHERE c.tenant = q.tenant AND c.run_id = q.run_id
              AND c.state NOT IN ('pending', 'dispatching')
              AND c.step = (SELECT max(seq) FROM planner.steps WHERE run_id = q.run_id))
        OR EXISTS (
            SELECT 1 FROM admission.refusals f
            WHERE f.tenant = q.tenant AND f.run_id = q.run_id AND f.state <> 'pending'
              AND f.step = (SELECT max(seq) FROM planner.steps WHERE run_id = q.run_id)))
    ORDER BY q.touched_at LIMIT $2
    FOR UPDATE OF q SKIP LOCKED
) AS s
WHERE r.run_id = s.run_id
RETURNING r.tenant, r.run_id"""
# The runs that ended and whose result message may not be out: nobody cleared the flag the
# ending transaction set (`result_due`), and nobody locked them for a while. Claimed as
# `_CLAIM` does.
_CLAIM_ENDED: Final = """
UPDATE planner.runs AS r SET touched_at = now()
FROM (
    SELECT run_id FROM planner.runs
    WHERE result_due AND touched_at < now() - make_interval(secs => $1)
    ORDER BY touched_at LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS s
WHERE r.run_id = s.run_id
RETURNING r.tenant, r.run_id"""
# The answer governance recorded to the read a waiting run stopped for.
_PENDING_ANSWER: Final = """
SELECT p.pending_id::text AS pending_id, p.proposal_id, p.answer, p.answered_by,
       coalesce(p.answer_reason, '') AS reason, p.answer_decision_id::text AS decision_id,
       d.line, d.policy_version
FROM planner.runs r
JOIN governance.pending p
  ON p.pending_id = CASE WHEN r.pending_id ~ '^[0-9a-f-]{36}$' THEN r.pending_id::uuid END
 AND p.tenant = r.tenant
JOIN governance.decisions d ON d.decision_id = p.pending_id
WHERE r.tenant = $1 AND r.run_id = $2 AND r.status = 'awaiting_human'
  AND p.answer IS NOT NULL AND p.proposal_id IS NULL"""
# The command of the run's last step, if that step proposed one that admission admitted.
_LAST_COMMAND: Final = """
SELECT c.operation_id::text AS operation_id, c.step, c.action, c.state, c.receipt, c.reason
FROM admission.commands c
WHERE c.tenant = $1 AND c.run_id = $2
  AND c.step = (SELECT max(seq) FROM planner.steps WHERE run_id = $2)"""

# What admission answered the run's last step's proposal, if it did not become a command: a
# refusal, or an ask (still pending), as its message carried them. A person's answer (a
# rejection, a revision asked, an expiry) names governance's decision of the answer, and an
# expiry says why, as admission's message did.
_LAST_REFUSAL: Final = """
SELECT f.step, f.action, f.verdict, f.state,
       CASE WHEN f.state = 'expired'
            THEN 'the proposal expired unanswered (' || coalesce(p.answer_reason, '') || ')'
            ELSE f.reason END AS reason,
       coalesce(p.answer_decision_id, f.decision_id)::text AS decision_id,
       f.public_id, f.preview, f.expires_at
FROM admission.refusals f
LEFT JOIN governance.pending p
  ON p.pending_id = f.decision_id AND p.tenant = f.tenant AND f.state <> 'pending'
WHERE f.tenant = $1 AND f.run_id = $2
  AND f.step = (SELECT max(seq) FROM planner.steps WHERE run_id = $2)
  AND NOT EXISTS (SELECT 1 FROM admission.commands c
                  WHERE c.tenant = f.tenant AND c.run_id = f.run_id AND c.step = f.step)"""


class LastCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command as admission's registry records it."""

    operation_id: str
    step: int
    action: str
    state: str
    receipt: str | None
    reason: str | None


async def claim_stalled(
    conn: asyncpg.Connection, *, stall_s: float, limit: int
) -> list[tuple[str, str]]:
    """(tenant, run id) of up to `limit` running runs nobody drove for `stall_s` seconds."""
    rows = await conn.fetch(_CLAIM, stall_s, limit)
    return [(row["tenant"], row["run_id"]) for row in rows]


async def claim_answered(
    conn: asyncpg.Connection, *, stall_s: float, limit: int
) -> list[tuple[str, str]]:
    """(tenant, run id) of up to `limit` runs waiting for a person whose answer is recorded,
    nobody having driven them for `stall_s` seconds."""
    rows = await conn.fetch(_CLAIM_ANSWERED, stall_s, limit)
    return [(row["tenant"], row["run_id"]) for row in rows]


async def claim_ended(
    conn: asyncpg.Connection, *, stall_s: float, limit: int
) -> list[tuple[str, str]]:
    """(tenant, run id) of up to `limit` ended runs whose result may not have been published,
    nobody having locked them for `stall_s` seconds."""
    rows = await conn.fetch(_CLAIM_ENDED, stall_s, limit)
    return [(row["tenant"], row["run_id"]) for row in rows]


async def results_sent(conn: asyncpg.Connection, run_ids: list[str]) -> None:
    """The ended runs' result messages are out: nothing left for the sweeper."""
    await conn.execute(
        "UPDATE planner.runs SET result_due = false WHERE run_id = ANY($1) AND result_due",
        run_ids,
    )


async def pending_answer(
    conn: asyncpg.Connection, tenant: str, run_id: str
) -> DecisionAnswered | None:
    """The answer governance recorded to the decision the run waits on, as governance
    announces it; None when the run does not wait on an answered one."""
    row = await conn.fetchrow(_PENDING_ANSWER, tenant, run_id)
    if row is None:
        return None
    return DecisionAnswered(
        tenant=tenant,
        run_id=run_id,
        pending_id=row["pending_id"],
        proposal_id=row["proposal_id"],
        answer=row["answer"],
        reason=row["reason"][:512],
        answered_by=row["answered_by"][:512],
        decision_id=row["decision_id"],
        line=row["line"],
        policy_version=row["policy_version"],
    )


async def last_command(conn: asyncpg.Connection, tenant: str, run_id: str) -> LastCommand | None:
    """The command the run's last step proposed, if admission admitted one."""
    row = await conn.fetchrow(_LAST_COMMAND, tenant, run_id)
    return None if row is None else LastCommand(**dict(row))


async def last_refusal(
    conn: asyncpg.Connection, tenant: str, run_id: str
) -> ProposalRefused | None:
    """What admission answered the run's last step's proposal that did not become a command,
    as its message carried it (a refusal, or an ask); None if it has no such record."""
    row = await conn.fetchrow(_LAST_REFUSAL, tenant, run_id)
    if row is None:
        return None
    ask = row["verdict"] == "ask"
    preview = row["preview"]
    if isinstance(preview, str):
        preview = msgspec.json.decode(preview)
    expires = row["expires_at"]
    return ProposalRefused(
        tenant=tenant,
        run_id=run_id,
        step=row["step"],
        action=row["action"][:512],
        verdict=row["verdict"],
        reason=row["reason"][:500],
        decision_id=row["decision_id"],
        pending_id=row["decision_id"] if ask else None,
        proposal_id=row["public_id"] if ask else None,
        preview=preview if ask else None,
        expires_at=expires.isoformat() if ask and expires is not None else None,
    )
