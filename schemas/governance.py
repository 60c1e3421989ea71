"""The `decide` request/reply every capability call goes through."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.base import AgentName, Command, Event, Id, Principal, ShortText, Tenant

__all__ = ["DecideRequest", "Decision", "Verdict"]

Verdict = Literal["allow", "deny", "ask"]


class DecideRequest(Command):
    """May this agent, for this principal, call this tool now?"""

    tenant: Tenant
    principal: Principal
    agent: AgentName
    run_id: Id
    tool: ShortText
    first_argument: ShortText = ""


class Decision(Event):
    """The answer, naming the line of `decide` that gave it and the policy version it read."""

    decision_id: Id
    verdict: Verdict
    line: Annotated[int, msgspec.Meta(ge=1, le=6)]
    family: ShortText
    reason: ShortText
    policy_version: ShortText
