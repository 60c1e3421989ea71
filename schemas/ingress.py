"""Messages ingress publishes once a host's request is verified."""

from __future__ import annotations

from typing import Literal

from schemas.base import Event, Id, Principal, ShortText, Tenant

__all__ = ["ProposalAnswer"]


class ProposalAnswer(Event, frozen=True):
    """A verified approver approves or rejects a proposal by its id: nothing else is trusted
    from the approver's message (no amount, no body, no value that was approved)."""

    tenant: Tenant
    request_id: Id
    approver: Principal
    proposal_id: Id
    # `revise`: send it back with a reason, which the run (or host) gets as a typed outcome.
    answer: Literal["approve", "reject", "revise"]
    reason: ShortText = ""
    grant: Literal["once", "always"] = "once"
    # Set when the approver answered the proposal's pending decision (a `HumanDecision` naming
    # it): the decision must be this proposal's, and the answer is a `DecisionResult`.
    pending_id: Id | None = None
