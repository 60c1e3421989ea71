"""Proposals of side effects, for admission to judge: from the planner, or from ingress when a
host submits a command directly."""

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
    expected_revision: ShortText | None = None
    # Set when a host submitted the command itself (no planner involved): the host's own key,
    # and the request to answer on `writ.out.results.<tenant>`.
    operation_key: Id | None = None
    request_id: Id | None = None
