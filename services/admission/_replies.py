"""What admission answers: a refusal to the run that proposed, and a host's command result
(what its key's command became, or why it did not become one)."""

from __future__ import annotations

from actions.base import Outcome, outcome_of
from libs.bus import publish
from libs.runtime import Runtime
from schemas import subjects
from schemas.admission import ProposalRefused, RefusalVerdict
from schemas.dispatcher import CommandOutcome
from schemas.host import CommandResult, CommandStatus, ErrorInfo, ProposalView
from schemas.planner import ProposeCommand
from services.admission.store import AdmissionStore, ProposalRow

__all__ = ["Replies", "view_of"]


class Replies:
    """Publishes admission's answers to runs and hosts."""

    def __init__(self, *, rt: Runtime, store: AdmissionStore) -> None:
        self._rt, self._store = rt, store

    async def answer_outcome(self, outcome: CommandOutcome) -> None:
        stored = await self._store.command(outcome.tenant, outcome.operation_id)
        if stored is None or stored.origin != "host" or stored.operation_key is None:
            return  # a run's command: the planner answers its host
        await self.answer_host(
            outcome.tenant,
            stored.request_id or "",
            stored.operation_key,
            outcome.operation_id,
            outcome.state,
            outcome.receipt,
            outcome.reason,
        )
        await self._store.told_host(outcome.tenant, outcome.operation_id, outcome.state)

    async def answer_host(
        self,
        tenant: str,
        request_id: str,
        operation_key: str,
        operation_id: str | None,
        status: CommandStatus,
        receipt: str | None,
        reason: str | None,
        code: str | None = None,
        pending_id: str | None = None,
        proposal: ProposalView | None = None,
    ) -> None:
        error = None
        outcome: Outcome | None = None
        if operation_id is not None:
            outcome = outcome_of(status, receipt=receipt, reason=reason, operation_id=operation_id)
            if outcome.kind == "terminal_failure":
                reason = outcome.detail  # a correlation id, never the provider's words
        if status not in ("succeeded", "pending", "dispatching"):
            error = ErrorInfo(code=code or status.upper(), message=(reason or status)[:512])
        await publish(
            self._rt.js,
            subjects.result(tenant),
            CommandResult(
                request_id=request_id,
                operation_key=operation_key,
                status=status,
                operation_id=operation_id,
                receipt=receipt,
                error=error,
                pending_id=pending_id,
                proposal=proposal,
                outcome=outcome.kind if outcome else None,
                correlation_id=outcome.correlation_id if outcome else None,
            ),
            msg_id=f"command-result:{tenant}:{request_id}:{operation_id}:{status}",
        )

    async def refuse(
        self,
        p: ProposeCommand,
        verdict: RefusalVerdict,
        reason: str,
        decision_id: str | None = None,
        *,
        pending_id: str | None = None,
        proposal: ProposalView | None = None,
    ) -> None:
        if p.operation_key is not None:
            statuses: dict[str, CommandStatus] = {
                "deny": "denied",
                "ask": "awaiting_human",
                "invalid": "rejected",
                "conflict": "conflict",
                "rejected": "rejected",
                "revise": "rejected",
            }
            status = statuses[verdict]
            code = {
                "deny": "DENIED",
                "ask": "AWAITING_HUMAN",
                "invalid": "INVALID_COMMAND",
                "conflict": "CONFLICT",
                "rejected": "REJECTED",
                "revise": "REVISION_ASKED",
            }[verdict]
            await self.answer_host(
                p.tenant,
                p.request_id or "",
                p.operation_key,
                None,
                status,
                None,
                reason,
                code,
                pending_id,
                proposal,
            )
            return
        if verdict == "invalid":
            # Recorded before it is sent: a refusal the bus lost is re-driven from the record.
            await self._store.record_invalid(p, reason)
        await publish(
            self._rt.js,
            subjects.refused(p.tenant),
            ProposalRefused(
                tenant=p.tenant,
                run_id=p.run_id,
                step=p.step,
                action=p.action[:512],
                verdict=verdict,
                reason=reason,
                decision_id=decision_id,
                pending_id=pending_id,
                proposal_id=proposal.proposal_id if proposal else None,
                preview=proposal.preview if proposal else None,
                expires_at=proposal.expires_at if proposal else None,
            ),
            msg_id=f"refused:{p.tenant}:{p.run_id}:{p.step}:{verdict}",
        )


def view_of(proposal: ProposalRow) -> ProposalView:
    """What a host or a run is shown of a proposal waiting for a person."""
    expires = proposal.expires_at.isoformat() if proposal.expires_at else ""
    return ProposalView(
        proposal_id=proposal.public_id,
        action=proposal.action,
        preview=proposal.preview,
        expires_at=expires,
    )
