"""What operators do from the command line, over the bus (never with a database password)."""

from __future__ import annotations

import msgspec
import nats

from schemas import subjects
from schemas.dispatcher import ListUnknown, Reconcile, Reconciled, UnknownCommands

__all__ = ["list_unknown", "resolve"]


async def list_unknown(nats_url: str, tenant: str) -> int:
    """Print the tenant's `unknown` commands; exit status 0."""
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(subjects.UNKNOWN_LIST,
                                 msgspec.json.encode(ListUnknown(tenant=tenant)), timeout=5)
    finally:
        await nc.close()
    answer = msgspec.json.decode(reply.data, type=UnknownCommands)
    if not answer.commands:
        print(f"no unknown commands for {tenant}")
    for c in answer.commands:
        print(f"{c.operation_id}  {c.action:<24} since {c.since}  by {c.principal}\n"
              f"    arguments {msgspec.json.encode(c.arguments).decode()}\n"
              f"    why       {c.reason or '-'}")
    return 0


async def resolve(nats_url: str, tenant: str, operation_id: str, state: str,
                  receipt: str | None, evidence: str, by: str) -> int:
    """Record a reconciliation; exit status 0 if it was recorded, 1 if refused."""
    ask = Reconcile(tenant=tenant, operation_id=operation_id, state=state, receipt=receipt,
                    evidence=evidence, resolved_by=by)
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(subjects.RECONCILE, msgspec.json.encode(ask), timeout=5)
    finally:
        await nc.close()
    answer = msgspec.json.decode(reply.data, type=Reconciled)
    print(answer.message)
    return 0 if answer.ok else 1
