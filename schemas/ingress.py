"""Messages ingress publishes once a host's request is verified."""

from __future__ import annotations

from schemas.base import AgentName, Event, Id, Principal, Tenant, Text

__all__ = ["RunStarted"]


class RunStarted(Event):
    """A verified request became a run; tenant and principal come from the host's token."""

    run_id: Id
    request_id: Id
    tenant: Tenant
    principal: Principal
    agent: AgentName
    input: Text
    attended: bool = False
