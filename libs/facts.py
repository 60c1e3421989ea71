"""Reading the facts a preview stands on: the one client of `ReadFacts`, for admission (a
proposal's preview) and the planner (a plan step's preview, and again when it is taken).

A host record is read through the host's MCP server, by retrieval (the only holder of that
credential); everything else by the dispatcher (the only holder of the connectors'). Neither
caller holds a credential to read anything itself.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from libs.deadline import timed_request
from libs.errors import RetryableError
from schemas import subjects
from schemas.dispatcher import FactsKind, FactsRead, ReadFacts

__all__ = ["facts_subject", "read_facts"]

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(FactsRead)


def facts_subject(kind: str) -> str:
    """Who reads a resource of this kind: retrieval for a host record, else the dispatcher."""
    return subjects.HOST_FACTS if kind == "host_ticket" else subjects.FACTS


async def read_facts(
    nc: Client,
    tenant: str,
    kind: FactsKind,
    resource_id: str,
    *,
    timeout: float,
    delay: float | None = None,
) -> dict[str, Any] | None:
    """The resource's state now (None: no such resource).

    Raises:
        RetryableError: nobody answered, or the reader could not read it now (nak'ed after
            `delay` seconds, or the actor's backoff).
    """
    subject = facts_subject(kind)
    ask = ReadFacts(tenant=tenant, kind=kind, id=resource_id)
    try:
        reply = await timed_request(nc, subject, _ENCODER.encode(ask), timeout=timeout)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise RetryableError(f"{subject} did not read {kind}: {exc!r}", delay=delay) from exc
    if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
        raise RetryableError(
            f"reading {kind} failed: {reply.headers.get('Nats-Service-Error')}", delay=delay
        )
    read = _DECODER.decode(reply.data)
    return read.facts if read.found else None
