"""Messages retrieval publishes: evidence, always marked untrusted."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from schemas.base import AgentName, Event, Id, Principal, ShortText, Tenant, Text

__all__ = ["Evidence", "EvidenceGathered"]


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """One tenant-scoped document excerpt; content a document says is data, never authority."""

    document_id: Id
    kind: ShortText
    title: ShortText
    text: Text
    rank: float
    trust: Literal["untrusted"] = "untrusted"


class EvidenceGathered(Event):
    """Evidence for a run, handed to the planner."""

    run_id: Id
    request_id: Id
    tenant: Tenant
    principal: Principal
    agent: AgentName
    input: Text
    evidence: Annotated[list[Evidence], msgspec.Meta(max_length=16)]
    attended: bool = False
