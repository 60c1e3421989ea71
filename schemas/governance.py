"""Governance's messages: `decide` for every capability call, runs it must know about, and the
pending decisions people answer."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.base import AgentName, Command, Event, Family, Id, Principal, ShortText, Tenant

__all__ = [
    "Answer",
    "AnswerDecision",
    "DecideRequest",
    "Decision",
    "DecisionAnswered",
    "ListPending",
    "PendingDecision",
    "PendingDecisions",
    "RegisterRun",
    "RunRegistered",
    "Verdict",
]

Verdict = Literal["allow", "deny", "ask"]
Answer = Literal["once", "always", "deny"]


class DecideRequest(Command):
    """May this agent, for this principal, call this tool now?"""

    tenant: Tenant
    principal: Principal
    agent: AgentName
    run_id: Id
    tool: ShortText
    first_argument: ShortText = ""
    # The proposal an ask would be about (admission's id), so the answer can find it.
    proposal_id: Id | None = None
    # At dispatch: the decision the command was admitted under. If it is a person's answer to
    # exactly this call, it stands in for a grant (denials and revocations still come first).
    approval_id: Id | None = None


class Decision(Event):
    """The answer, naming the line of `decide` that gave it and the policy version it read.

    An `ask` comes with a `pending_id` (the decision id) and the answers a person may give.
    """

    decision_id: Id
    verdict: Verdict
    line: Annotated[int, msgspec.Meta(ge=1, le=6)]
    family: ShortText
    reason: ShortText
    policy_version: ShortText
    options: Annotated[list[Answer], msgspec.Meta(max_length=3)] = []
    pending_id: Id | None = None


class RegisterRun(Command):
    """Ingress tells governance, before the run starts, what only a verified host may say."""

    tenant: Tenant
    run_id: Id
    principal: Principal
    agent: AgentName
    attended: bool = False
    grants: Annotated[list[Family], msgspec.Meta(max_length=5)] = []


class RunRegistered(Event):
    """The run is known to governance."""

    run_id: Id


class AnswerDecision(Command):
    """A verified approver's answer to a pending decision (from ingress)."""

    tenant: Tenant
    principal: Principal
    request_id: Id
    pending_id: Id
    answer: Answer
    reason: ShortText = ""


class DecisionAnswered(Event):
    """A pending decision was answered (by a person, or by the clock: unanswered is deny)."""

    tenant: Tenant
    pending_id: Id
    run_id: Id
    proposal_id: Id | None
    answer: Answer
    reason: ShortText
    answered_by: ShortText
    decision_id: Id  # the decision the answer became: what admission stores with the command
    line: int
    policy_version: ShortText


class ListPending(Command):
    """Ask governance for a tenant's unanswered decisions (`writ pending`)."""

    tenant: Tenant


class PendingDecision(msgspec.Struct, frozen=True, kw_only=True):
    """One decision waiting for a person."""

    pending_id: Id
    run_id: Id
    agent: ShortText
    principal: ShortText
    tool: ShortText
    family: ShortText
    first_argument: ShortText
    reason: ShortText
    options: list[Answer]
    attended: bool
    deadline: ShortText | None
    created_at: ShortText


class PendingDecisions(Event):
    """The answer to `ListPending`."""

    decisions: Annotated[list[PendingDecision], msgspec.Meta(max_length=500)]
