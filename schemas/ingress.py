"""Messages ingress publishes once a host's request is verified."""

from __future__ import annotations

from typing import Literal

from schemas.base import AgentName, Event, Id, Principal, ShortText, Tenant, Text

__all__ = ["ProposalAnswer", "RunStarted"]


class RunStarted(Event):
    """A verified request became a run; tenant and principal come from the host's token."""

    run_id: Id
    request_id: Id
    tenant: Tenant
    principal: Principal
    agent: AgentName
    input: Text
    attended: bool = False


class ProposalAnswer(Event):
    """A verified approver approves or rejects a proposal by its id: nothing else is trusted
    from the approver's message (no amount, no body, no value that was approved)."""

    tenant: Tenant
    request_id: Id
    approver: Principal
    proposal_id: Id
    answer: Literal["approve", "reject"]
    reason: ShortText = ""
