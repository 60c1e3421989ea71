"""Messages the planner publishes: proposals of side effects, for admission to judge."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from schemas.base import AgentName, Command, Id, Principal, ShortText, Tenant

__all__ = ["ProposeCommand"]


class ProposeCommand(Command):
    """The model asks for an action; admission validates it against the action's contract.

    `arguments` is what the model wrote, untyped on purpose: only admission turns it into the
    contract's typed arguments, and rejects what does not fit.
    """

    run_id: Id
    step: Annotated[int, msgspec.Meta(ge=0, le=1000)]
    tenant: Tenant
    principal: Principal
    agent: AgentName
    action: ShortText
    arguments: Annotated[dict[str, Any], msgspec.Meta(max_length=32)]
