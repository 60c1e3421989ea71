"""People's answers to pending decisions: from the inbox (a host's answer, its result
published), from admission by proposal id (request/reply), and the clock's deny of an ask nobody
answered in time."""

from __future__ import annotations

import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind

from actions import ACTIONS
from libs.actor import Delivery
from libs.bus import publish
from libs.runtime import Runtime
from libs.telemetry import extract_context
from schemas import subjects
from schemas.governance import AnswerDecision, ApprovalCounted, DecisionAnswered
from schemas.host import DecisionResult
from services.governance.store import Answered, Counted, GovernanceStore, NotAnswerable

__all__ = ["Answers"]


class Answers:
    """Records answers to pending decisions and announces what they became."""

    def __init__(self, *, rt: Runtime, store: GovernanceStore) -> None:
        self._rt, self._store = rt, store
        # Contracts no standing grant may cover: "always" is refused for them at the answer
        # too, even where a decision recorded before said otherwise.
        self._never_always = frozenset(n for n, c in ACTIONS.items() if not c.grant_may_cover())
        self._encoder = msgspec.json.Encoder()

    async def on_answer(self, delivery: Delivery[AnswerDecision]) -> None:
        """A host's answer from the inbox: record it, announce it, publish its result."""
        answer = delivery.message
        outcome = await self._store.answer(
            tenant=answer.tenant,
            pending_id=answer.pending_id,
            answer=answer.answer,
            answered_by=answer.principal,
            reason=answer.reason,
            never_always=self._never_always,
        )
        code: str | None = None
        if isinstance(outcome, Answered):
            await self._announce(outcome)
            accepted, message = True, f"answered {answer.answer}"
        else:
            assert not isinstance(outcome, Counted)  # one approver: never only counted
            accepted, message, code = False, outcome.reason, outcome.code
        await publish(
            self._rt.js,
            subjects.result(answer.tenant),
            DecisionResult(
                request_id=answer.request_id,
                pending_id=answer.pending_id,
                accepted=accepted,
                message=message[:512],
                code=code,
            ),
            msg_id=f"decision-result:{answer.tenant}:{answer.request_id}",
        )

    async def answer_endpoint(self, request: Request) -> None:
        """Admission records an approval by proposal id here and waits for what it became.

        Nothing is announced: the caller makes the one pending -> executing claim itself.
        Four eyes: an approval that, with the earlier ones still counting (their approvers not
        revoked since), is not enough is checked the same way and answered `ApprovalCounted`.
        Errors: 403 the approver may not answer, 409 already answered, 410 nothing to answer.
        """
        try:
            answer = msgspec.json.decode(request.data, type=AnswerDecision)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid AnswerDecision: {exc}")
            return
        self._rt.faults.raise_if("governance.answer")
        with self._rt.tracer.start_as_current_span(
            "governance answer", context=extract_context(request.headers), kind=SpanKind.SERVER
        ):
            if await self._store.revoked(answer.tenant, answer.principal):
                await request.respond_error("403", "the approver's access was revoked")
                return
            counting = await self._store.still_counting(answer.tenant, answer.approved_by)
            outcome = await self._store.answer(
                tenant=answer.tenant,
                pending_id=answer.pending_id,
                answer=answer.answer,
                answered_by=answer.principal,
                reason=answer.reason,
                same_again=True,
                proposal_id=answer.proposal_id,
                never_always=self._never_always,
                needed=answer.approvers_needed,
                co_approvers=counting,
            )
        if isinstance(outcome, Counted):
            await request.respond(
                self._encoder.encode(
                    ApprovalCounted(
                        tenant=answer.tenant,
                        pending_id=answer.pending_id,
                        approvers=outcome.approvers,
                        needed=answer.approvers_needed,
                    )
                )
            )
            return
        if isinstance(outcome, NotAnswerable):
            code = (
                "409"
                if outcome.reason.startswith("already answered")
                else "410"
                if outcome.reason.startswith("no such") or outcome.code == "EXPIRED"
                else "422"
                if outcome.code in ("INVALID_ANSWER", "PROPOSAL_REQUIRED")
                else "403"
            )
            await request.respond_error(code, outcome.reason[:500])
            return
        await request.respond(
            self._encoder.encode(
                DecisionAnswered(
                    tenant=outcome.tenant,
                    pending_id=outcome.pending_id,
                    run_id=outcome.run_id,
                    proposal_id=outcome.proposal_id,
                    answer=outcome.answer,
                    reason=outcome.reason[:512],
                    answered_by=outcome.answered_by[:512],
                    decision_id=outcome.decision_id,
                    line=outcome.line,
                    policy_version=outcome.policy_version,
                )
            )
        )

    async def _announce(self, answered: Answered) -> None:
        await publish(
            self._rt.js,
            subjects.answered(answered.tenant),
            DecisionAnswered(
                tenant=answered.tenant,
                pending_id=answered.pending_id,
                run_id=answered.run_id,
                proposal_id=answered.proposal_id,
                answer=answered.answer,
                reason=answered.reason[:512],
                answered_by=answered.answered_by[:512],
                decision_id=answered.decision_id,
                line=answered.line,
                policy_version=answered.policy_version,
            ),
            msg_id=f"answered:{answered.pending_id}",
        )

    async def deny_overdue(self) -> None:
        """An ask nobody answered in time is a deny: an attended one after five minutes, any
        other once its proposal expired (the decision closes with it)."""
        for tenant, pending_id, why in await self._store.overdue():
            outcome = await self._store.answer(
                tenant=tenant,
                pending_id=pending_id,
                answer="deny",
                answered_by="nobody",
                reason=why,
                by_clock=True,
            )
            if isinstance(outcome, Answered):
                await self._announce(outcome)
