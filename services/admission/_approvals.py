"""Admission's approvals (the approval-contracts note): a pending proposal answered by its opaque
id, or through the pending decision governance recorded for it, becomes the one pending -> executing
claim that admits it, or a recorded rejection. A collaborator of `AdmissionService`
(`service.py`): it holds the store and runtime it acts through, and is handed the service's two
answers to a host (a known command's state, a refusal) as callables."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from actions import ACTIONS
from actions.base import outcome_of
from libs.bus import publish
from libs.deadline import timed_request
from libs.errors import RetryableError
from libs.runtime import Runtime
from libs.telemetry import links_to
from schemas import subjects
from schemas.governance import AnswerDecision, ApprovalCounted, Decision, DecisionAnswered
from schemas.host import ApprovalResult, ApprovalStatus, DecisionResult
from schemas.ingress import ProposalAnswer
from schemas.planner import ProposeCommand
from services.admission.logic import operation_id_for
from services.admission.store import AdmissionStore, ProposalRow, StoredCommand

__all__ = ["ProposalApprovals"]

log = logging.getLogger("writ.admission")


class ProposalApprovals:
    """What an approver's (or governance's) answer to a pending proposal leads to."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: AdmissionStore,
        command_ttl: timedelta,
        decide_timeout_s: float,
        known: Callable[..., Awaitable[None]],
        refuse: Callable[..., Awaitable[None]],
    ) -> None:
        self._rt, self._store = rt, store
        self._ttl, self._decide_timeout = command_ttl, decide_timeout_s
        self._known, self._refuse = known, refuse
        self._answered_decoder = msgspec.json.Decoder(DecisionAnswered | ApprovalCounted)
        self._encoder = msgspec.json.Encoder()

    async def on_answered(self, answered: DecisionAnswered) -> None:
        """A pending decision about a proposal was answered (`writ decide`, or nobody in
        time): admit the proposal, or reject it."""
        if answered.proposal_id is None:
            return
        proposal = await self._store.proposal_row(answered.tenant, proposal_id=answered.proposal_id)
        if (
            proposal is None
            or proposal.state != "pending"
            or (proposal.decision_id != answered.pending_id)
        ):
            return  # already acted on (a redelivery, or approved by its id), or not ours
        if (
            answered.answer == "deny"
            and answered.answered_by == "nobody"  # governance's clock: the proposal expired
            and await self._store.expire_proposal(proposal)
        ):
            await self._refuse(
                _proposal_message(proposal),
                "rejected",
                f"the proposal expired unanswered ({answered.reason})"[:500],
                answered.decision_id,
            )
            return
        if answered.answer == "deny":
            await self._reject(
                proposal, answered.answered_by, answered.reason, answered.decision_id
            )
            return
        contract = ACTIONS.get(proposal.action)
        needed = contract.approvers_needed(proposal.preview) if contract is not None else 1
        if needed > 1:
            given = await self._store.approvals(proposal.tenant, proposal.proposal_id)
            others = {a.approver for a in given if a.counts} - {
                answered.answered_by,
                proposal.principal,
            }
            if len(others) < needed - 1:
                log.warning(
                    "proposal %s: one approval of %d, not admitted", proposal.public_id, needed
                )
                return  # four eyes: one answer is not enough, whichever door it came through
        await self._claim(proposal, answered, answered.answered_by)

    async def on_proposal_answer(self, ans: ProposalAnswer) -> None:
        """An approver approves or rejects a proposal by its opaque id (the approval-contracts
        note): check it all again, record the answer with governance, then the one atomic claim."""
        proposal = await self._store.proposal_row(ans.tenant, public_id=ans.proposal_id)
        if proposal is None:
            # Unknown, tampered, or another tenant's id: the same answer for all three.
            await self._reply(
                ans, "not_approvable", reason="no such proposal", code="UNKNOWN_PROPOSAL"
            )
            return
        if proposal.expired is not None:
            # What approving it would execute was erased: nothing may be approved blind.
            await self._reply(
                ans,
                "not_approvable",
                reason=f"payload expired (window {proposal.expired})",
                code="PAYLOAD_EXPIRED",
            )
            return
        if (
            ans.pending_id is not None
            and proposal.state == "pending"
            and ans.pending_id != proposal.decision_id
        ):
            # A decision answered on a proposal must be that proposal's own (once answered,
            # the proposal's state says what became of it, whoever asks).
            await self._reply(
                ans,
                "not_approvable",
                reason="the decision is not about this proposal",
                code="PROPOSAL_MISMATCH",
            )
            return
        if ans.answer == "revise" and not ans.reason.strip():
            await self._reply(
                ans,
                "not_approvable",
                code="INVALID_ANSWER",
                reason="asking for a revision needs a reason: it is what the agent must revise",
            )
            return
        if not await self._still_approvable(ans, proposal):
            return
        needed = ACTIONS[proposal.action].approvers_needed(proposal.preview)
        if ans.answer == "approve" and needed > 1:
            answered = await self._four_eyes(ans, proposal, needed)
        else:
            reply = await self._answer_with_governance(ans, proposal)
            answered = reply if isinstance(reply, DecisionAnswered) else None
        if answered is None:
            return
        self._rt.faults.crash_if("admission.after_answer")  # governance answered, nothing moved
        if ans.answer == "revise":
            await self._reject(
                proposal, ans.approver, ans.reason, answered.decision_id, revise=True
            )
            await self._reply(ans, "rejected", reason=ans.reason, code="REVISION_ASKED")
            return
        if ans.answer == "reject":
            await self._reject(proposal, ans.approver, ans.reason, answered.decision_id)
            await self._reply(ans, "rejected", reason=ans.reason or None)
            return
        await self._claim(proposal, answered, ans.approver, ans)

    async def _still_approvable(self, ans: ProposalAnswer, proposal: ProposalRow) -> bool:
        """Pending, not expired, and its frozen arguments still decode; otherwise answer why."""
        if proposal.state != "pending":
            await self._reply_state(ans, proposal)
            return False
        if ans.answer == "approve" and ans.approver == proposal.principal:
            # Separation of duties: whoever asked for the run cannot also approve what it
            # proposes (they may still reject it: that only stops their own request).
            await self._reply(
                ans,
                "not_approvable",
                code="SEPARATION_OF_DUTIES",
                reason="the principal who requested the run cannot approve "
                "its proposals; another approver must",
            )
            return False
        if proposal.expires_at is not None and proposal.expires_at <= datetime.now(UTC):
            await self._store.expire_proposal(proposal)
            await self._reply(ans, "not_approvable", reason="the proposal expired", code="EXPIRED")
            return False
        contract = ACTIONS.get(proposal.action)
        try:
            if contract is None or contract.version != proposal.action_version:
                raise ValueError(f"no contract {proposal.action} v{proposal.action_version}")
            contract.decode_arguments(proposal.arguments)
            contract.decode_preview(proposal.preview)
        except (ValueError, msgspec.ValidationError) as exc:
            # A stored contract that no longer decodes is Writ's fault, not the approver's.
            log.error(
                "proposal %s does not decode (%s): %r", proposal.proposal_id, ans.request_id, exc
            )
            await self._reply(
                ans,
                "not_approvable",
                outcome="terminal_failure",
                reason="the stored proposal cannot be executed",
                code="TERMINAL_FAILURE",
                correlation_id=proposal.proposal_id,
            )
            return False
        return True

    async def _four_eyes(
        self, ans: ProposalAnswer, proposal: ProposalRow, needed: int
    ) -> DecisionAnswered | None:
        """An approval of a proposal whose contract asks for `needed` distinct approvers.
        Governance checks every approval when it is given, the first as much as the one that
        completes them (approver revoked, tenant, the requester, the decision still open), and
        checks the earlier approvers again: one revoked since no longer counts. Its answer once
        they are enough; otherwise (after replying how many count, or why not) None."""
        given = await self._store.approvals(proposal.tenant, proposal.proposal_id)
        before = [a.approver for a in given]
        # Only approvals that still count are put to governance as the earlier ones (it checks
        # them again by the same rule, `governance.approval_void`).
        others = [
            a.approver
            for a in given
            if a.counts and a.approver not in (ans.approver, proposal.principal)
        ]
        if ans.approver in before and len(others) < needed - 1:
            await self._already_approved(ans, needed)
            return None
        reply = await self._answer_with_governance(ans, proposal, needed, others)
        if not isinstance(reply, ApprovalCounted):
            return reply
        if not await self._store.add_approval(proposal, ans.approver):
            fresh = await self._store.proposal_row(
                proposal.tenant, proposal_id=proposal.proposal_id
            )
            if fresh is not None and fresh.state != "pending":
                await self._reply_state(ans, fresh)
            else:
                await self._already_approved(ans, needed)
            return None
        after = await self._store.approvals(proposal.tenant, proposal.proposal_id)
        meanwhile = [
            a.approver
            for a in after
            if a.counts and a.approver not in (ans.approver, proposal.principal, *others)
        ]
        if meanwhile:
            # Another approver approved between the two reads: together they may be enough
            # (each one's approval is the other's earlier one).
            reply = await self._answer_with_governance(ans, proposal, needed, [*others, *meanwhile])
            if not isinstance(reply, ApprovalCounted):
                return reply
        await self._reply(
            ans,
            "approval_recorded",
            reason=f"{len(reply.approvers)} of {needed} approvals: "
            "another approver must approve it",
        )
        return None

    async def _already_approved(self, ans: ProposalAnswer, needed: int) -> None:
        await self._reply(
            ans,
            "not_approvable",
            code="ALREADY_APPROVED",
            reason=f"you approved it already: it needs {needed} distinct approvers, "
            "another approver must approve it",
        )

    async def _answer_with_governance(
        self,
        ans: ProposalAnswer,
        proposal: ProposalRow,
        needed: int = 1,
        approved_by: list[str] | None = None,
    ) -> DecisionAnswered | ApprovalCounted | None:
        """Approvals are governance's to record: it checks the approver (revoked, tenant, the
        requester) and answers the pending decision, or only counts an approval of several;
        None (after replying) if it refused."""
        ask = AnswerDecision(
            tenant=ans.tenant,
            principal=ans.approver,
            request_id=ans.request_id,
            pending_id=proposal.decision_id or "",
            answer=ans.grant if ans.answer == "approve" else "deny",
            reason=ans.reason,
            proposal_id=proposal.proposal_id,
            approvers_needed=needed,
            approved_by=(approved_by or [])[:8],
        )
        try:
            reply = await timed_request(
                self._rt.nc,
                subjects.ANSWER,
                self._encoder.encode(ask),
                timeout=self._decide_timeout,
            )
        except (NatsTimeoutError, NoRespondersError) as exc:
            raise RetryableError(f"governance did not answer: {exc!r}", delay=1.0) from exc
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            code = reply.headers.get("Nats-Service-Error-Code")
            message = reply.headers.get("Nats-Service-Error") or "refused"
            if code == "409":
                # Answered already, by a concurrent approval: the claim below settles who won.
                fresh = await self._store.proposal_row(ans.tenant, public_id=ans.proposal_id)
                if fresh is not None and fresh.state != "pending":
                    await self._reply_state(ans, fresh)
                    return None
            if code in ("403", "409", "410", "422"):
                await self._reply(
                    ans,
                    "not_approvable",
                    reason=message[:500],
                    code={
                        "403": "FORBIDDEN",
                        "409": "ALREADY_ANSWERED",
                        "410": "UNKNOWN_PENDING",
                        "422": "INVALID_ANSWER",
                    }[code],
                )
                return None
            raise RetryableError(f"governance error {code}: {message}")
        return self._answered_decoder.decode(reply.data)

    async def _claim(
        self,
        proposal: ProposalRow,
        answered: DecisionAnswered,
        approver: str,
        ans: ProposalAnswer | None = None,
    ) -> None:
        decision = Decision(
            decision_id=answered.decision_id,
            verdict="allow",
            line=answered.line,
            family=ACTIONS[proposal.action].family,
            reason=f"approved {answered.answer} by {approver}"[:512],
            policy_version=answered.policy_version,
        )
        operation_id = operation_id_for(
            proposal.tenant, proposal.run_id, proposal.step, proposal.operation_key
        )
        # The approval is its own trace (the approver's), linked to the run's: the command it
        # admits carries the approval's context onwards.
        with self._rt.tracer.start_as_current_span(
            "admission approve", links=links_to(proposal.traceparent, "resumed")
        ) as span:
            span.set_attribute("writ.operation_id", operation_id)
            claimed = await self._store.approve_for_execution(
                proposal,
                approver=approver,
                decision=decision,
                ttl=self._ttl,
                operation_id=operation_id,
            )
        p = _proposal_message(proposal)
        if claimed:
            await self._known(
                p,
                operation_id,
                proposal.request_hash,
                StoredCommand(
                    request_hash=proposal.request_hash,
                    state="pending",
                    receipt=None,
                    reason=None,
                    decision_id=decision.decision_id,
                    decision_line=decision.line,
                    policy_version=decision.policy_version,
                    origin="host" if proposal.operation_key else "run",
                    operation_key=proposal.operation_key,
                    request_id=proposal.request_id,
                ),
                replay=False,
            )
            if ans is not None:
                await self._reply(ans, "claimed", outcome="pending")
            return
        if ans is not None:
            fresh = await self._store.proposal_row(
                proposal.tenant, proposal_id=proposal.proposal_id
            )
            assert fresh is not None
            await self._reply_state(ans, fresh)

    async def _reject(
        self, proposal: ProposalRow, by: str, why: str, decision_id: str, *, revise: bool = False
    ) -> None:
        """pending -> rejected, and the run (or host) told; `revise`: sent back for a revision,
        the reason being what to revise (a typed outcome of its own, journaled as such)."""
        if revise:
            reason = f"revision asked by {by}: {why}"
        else:
            reason = f"rejected by {by}" + (f": {why}" if why else "")
        kind = "proposal.revision_asked" if revise else "proposal.rejected"
        if await self._store.reject_proposal(proposal, reason, by=by, kind=kind):
            await self._refuse(
                _proposal_message(proposal),
                "revise" if revise else "rejected",
                reason[:500],
                decision_id,
            )

    async def _reply_state(self, ans: ProposalAnswer, proposal: ProposalRow) -> None:
        """A proposal that is not pending: its recorded outcome, or why it cannot be approved."""
        if proposal.state in ("executing", "completed") and proposal.operation_id:
            outcome = outcome_of(
                proposal.command_state or "pending",
                receipt=proposal.receipt,
                reason=proposal.command_reason,
                operation_id=proposal.operation_id,
            )
            await self._reply(
                ans,
                "already_completed",
                outcome=outcome.kind,
                receipt=outcome.receipt,
                reason=outcome.detail or None,
                correlation_id=outcome.correlation_id,
            )
            return
        await self._reply(
            ans,
            "not_approvable",
            code="NOT_PENDING",
            reason=f"the proposal is {proposal.state}"
            + (f": {proposal.reason}" if proposal.reason else ""),
        )

    async def _reply(
        self,
        ans: ProposalAnswer,
        status: ApprovalStatus,
        *,
        outcome: str | None = None,
        receipt: str | None = None,
        reason: str | None = None,
        correlation_id: str | None = None,
        code: str | None = None,
    ) -> None:
        await publish(
            self._rt.js,
            subjects.result(ans.tenant),
            ApprovalResult(
                request_id=ans.request_id,
                proposal_id=ans.proposal_id,
                code=code,
                status=status,
                outcome=outcome,  # type: ignore[arg-type]
                receipt=receipt,
                reason=(reason or "")[:500] or None,
                correlation_id=correlation_id,
            ),
            msg_id=f"approval-result:{ans.tenant}:{ans.request_id}",
        )
        if ans.pending_id is not None:
            # Answered as a pending decision (a `HumanDecision` naming its proposal): its
            # approver waits for a `DecisionResult`.
            # A first of two approvals is taken too: recorded, and its message says another
            # approver must still approve.
            taken = status in ("claimed", "rejected", "approval_recorded")
            await publish(
                self._rt.js,
                subjects.result(ans.tenant),
                DecisionResult(
                    request_id=ans.request_id,
                    pending_id=ans.pending_id,
                    accepted=taken,
                    message=(
                        reason or status
                        if status == "approval_recorded"
                        else f"answered {ans.grant if ans.answer == 'approve' else 'deny'}"
                        if taken
                        else f"already answered: the proposal's outcome is {outcome or 'pending'}"
                        if status == "already_completed"
                        else reason or status
                    )[:512],
                    code=None if taken else (code or "ALREADY_ANSWERED"),
                ),
                msg_id=f"decision-result:{ans.tenant}:{ans.request_id}",
            )


def _proposal_message(proposal: ProposalRow) -> ProposeCommand:
    """The proposal as the planner (or host) sent it, to answer them about it."""
    return ProposeCommand(
        run_id=proposal.run_id,
        step=proposal.step,
        tenant=proposal.tenant,
        principal=proposal.principal,
        agent=proposal.agent,
        action=proposal.action,
        arguments=proposal.arguments,
        expected_revision=proposal.expected_revision,
        operation_key=proposal.operation_key,
        request_id=proposal.request_id,
    )
