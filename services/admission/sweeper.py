"""PostgreSQL re-drives the answers admission never acted on: a proposal still `pending` in
admission's registry whose decision governance answered (a person's approval or rejection, or
the clock's deny once it expired) at least `stall_s` seconds ago. The announcement was lost, or
admission stopped between governance recording the answer and its own claim, and the approval's
message will not come again. The answer, read from governance's record of it (granted
read-only), is acted on as its announcement would have been (`ProposalApprovals.on_answered`):
the one pending -> executing claim, a rejection or an expiry, each an atomic move of the
proposal, so a sweep racing a delivery (or another replica's sweep) acts once.

It also tells a host what became of its command when the dispatcher's outcome message was lost
before admission answered it: a host command in a final state, recorded `stall_s` seconds ago,
whose `CommandResult` was not published (`answered_state`, set once it is) is answered from
the registry, under the message id the answer would have had."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import asyncpg

from schemas.dispatcher import CommandOutcome
from schemas.governance import DecisionAnswered

__all__ = ["AnswerSweeper", "unacted_answers", "untold_outcomes"]

log = logging.getLogger("writ.admission")

# Pending proposals whose decision governance answered a while ago, oldest answer first; the
# partial index on pending proposals (`proposals_pending`) bounds the scan to those.
_UNACTED: Final = """
SELECT p.tenant, p.pending_id::text AS pending_id, p.run_id, a.proposal_id::text AS proposal_id,
       p.answer, p.answered_by, coalesce(p.answer_reason, '') AS reason,
       p.answer_decision_id::text AS decision_id, d.line, d.policy_version
FROM admission.proposals a
JOIN governance.pending p ON p.pending_id = a.decision_id AND p.tenant = a.tenant
JOIN governance.decisions d ON d.decision_id = p.pending_id
WHERE a.state = 'pending' AND p.answer IS NOT NULL
  AND p.answered_at < now() - make_interval(secs => $1)
ORDER BY p.answered_at LIMIT $2"""
# Host commands in a final state their host was not told of (`answered_state`), a while after
# the dispatcher recorded it, as the dispatcher's outcome message carried it.
_UNTOLD: Final = """
SELECT tenant, operation_id::text AS operation_id, run_id, step, action, state, receipt, reason
FROM admission.commands
WHERE origin = 'host' AND operation_key IS NOT NULL AND state NOT IN ('pending', 'dispatching')
  AND answered_state IS DISTINCT FROM state
  AND updated_at < now() - make_interval(secs => $1)
ORDER BY updated_at LIMIT $2"""


async def unacted_answers(
    pool: asyncpg.Pool, *, stall_s: float, limit: int
) -> list[DecisionAnswered]:
    """Up to `limit` answers to decisions about proposals still pending, recorded at least
    `stall_s` seconds ago, as governance announces them."""
    rows = await pool.fetch(_UNACTED, stall_s, limit)
    return [
        DecisionAnswered(
            tenant=row["tenant"],
            pending_id=row["pending_id"],
            run_id=row["run_id"],
            proposal_id=row["proposal_id"],
            answer=row["answer"],
            reason=row["reason"][:512],
            answered_by=row["answered_by"][:512],
            decision_id=row["decision_id"],
            line=row["line"],
            policy_version=row["policy_version"],
        )
        for row in rows
    ]


async def untold_outcomes(
    pool: asyncpg.Pool, *, stall_s: float, limit: int
) -> list[CommandOutcome]:
    """Up to `limit` outcomes of host commands whose host was not told, recorded at least
    `stall_s` seconds ago, as the dispatcher announces them."""
    rows = await pool.fetch(_UNTOLD, stall_s, limit)
    return [
        CommandOutcome(
            tenant=row["tenant"],
            operation_id=row["operation_id"],
            run_id=row["run_id"],
            step=row["step"],
            action=row["action"][:512],
            state=row["state"],
            receipt=(row["receipt"] or "")[:512] or None,
            reason=(row["reason"] or "")[:512] or None,
        )
        for row in rows
    ]


class AnswerSweeper:
    """Finds answers admission never acted on and acts on each once more."""

    def __init__(
        self, *, pool: asyncpg.Pool, stall_s: float = 20.0, every_s: float = 5.0, limit: int = 64
    ) -> None:
        self._pool, self._stall_s, self._every_s, self._limit = pool, stall_s, every_s, limit

    async def run(
        self,
        act: Callable[[DecisionAnswered], Awaitable[None]],
        tell: Callable[[CommandOutcome], Awaitable[None]],
    ) -> None:
        """Sweep every `every_s` seconds until cancelled; a failed sweep waits for the next."""
        while True:
            await anyio.sleep(self._every_s)
            try:
                await self.sweep(act)
                await self.tell_hosts(tell)
            except Exception as exc:
                log.warning("answer sweep failed: %r", exc)

    async def tell_hosts(self, tell: Callable[[CommandOutcome], Awaitable[None]]) -> int:
        """Answer the hosts of commands that ended untold; how many were answered."""
        outcomes = await untold_outcomes(self._pool, stall_s=self._stall_s, limit=self._limit)
        done = 0
        for outcome in outcomes:
            log.info(
                "sweeper tells the host of command %s:%s", outcome.tenant, outcome.operation_id
            )
            try:
                await tell(outcome)
            except Exception as exc:  # this command alone waits for a later sweep
                log.info("telling command %s left it for later: %r", outcome.operation_id, exc)
                continue
            done += 1
        return done

    async def sweep(self, act: Callable[[DecisionAnswered], Awaitable[None]]) -> int:
        """Act on the answers left now; how many were acted on without an error."""
        answers = await unacted_answers(self._pool, stall_s=self._stall_s, limit=self._limit)
        done = 0
        for answered in answers:
            log.info(
                "sweeper acts on the answer to proposal %s:%s",
                answered.tenant,
                answered.proposal_id,
            )
            try:
                await act(answered)
            except Exception as exc:  # this proposal alone waits for a later sweep
                log.info("sweeping proposal %s left it for later: %r", answered.proposal_id, exc)
                continue
            done += 1
        return done
