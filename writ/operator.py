"""What operators do from the command line, over the bus (never with a database password)."""

from __future__ import annotations

import uuid
from typing import TypeVar

import anyio
import msgspec
import nats

from schemas import subjects
from schemas.dispatcher import ListUnknown, Reconcile, Reconciled, UnknownCommands
from schemas.governance import ListPending, PendingDecisions
from schemas.host import HumanDecision

__all__ = ["answer_pending", "list_pending", "list_unknown", "resolve"]

T = TypeVar("T")


async def _ask(nats_url: str, subject: str, message: msgspec.Struct, answer: type[T]) -> T:
    """One request/reply with a service, decoded into its answer type."""
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(subject, msgspec.json.encode(message), timeout=5)
    finally:
        await nc.close()
    return msgspec.json.decode(reply.data, type=answer)


async def list_unknown(nats_url: str, tenant: str) -> int:
    """Print the tenant's `unknown` commands; exit status 0."""
    answer = await _ask(nats_url, subjects.UNKNOWN_LIST, ListUnknown(tenant=tenant),
                        UnknownCommands)
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
    answer = await _ask(nats_url, subjects.RECONCILE, ask, Reconciled)
    print(answer.message)
    return 0 if answer.ok else 1


async def list_pending(nats_url: str, tenant: str) -> int:
    """Print the tenant's decisions waiting for a person; exit status 0."""
    answer = await _ask(nats_url, subjects.PENDING_LIST, ListPending(tenant=tenant),
                        PendingDecisions)
    if not answer.decisions:
        print(f"no pending decisions for {tenant}")
    for d in answer.decisions:
        waits = f"deny at {d.deadline}" if d.deadline else "waits until answered"
        print(f"{d.pending_id}  {d.tool} ({d.family}) for agent {d.agent}, run {d.run_id}\n"
              f"    asked by  {d.principal}; {d.reason}\n"
              f"    argument  {d.first_argument or '-'}\n"
              f"    answers   {' | '.join(d.options)}; {waits}")
    return 0


async def answer_pending(nats_url: str, tenant: str, pending_id: str, answer: str,
                         reason: str, token: str, timeout: float = 10.0) -> int:
    """Publish a `HumanDecision` as an approver and wait for governance's verdict on it."""
    request_id = f"decide-{uuid.uuid4().hex[:12]}"
    decision = HumanDecision(request_id=request_id, token=token, pending_id=pending_id,
                             answer=answer, reason=reason)
    nc = await nats.connect(nats_url)
    try:
        results = await nc.subscribe(subjects.result(tenant))
        await nc.jetstream().publish(subjects.human_decision(tenant),
                                     msgspec.json.encode(decision),
                                     headers={"Nats-Msg-Id": request_id})
        with anyio.fail_after(timeout):
            async for msg in results.messages:
                result = msgspec.json.decode(msg.data)
                if result.get("type") == "DecisionResult" and result["request_id"] == request_id:
                    print(result["message"])
                    return 0 if result["accepted"] else 1
    finally:
        await nc.close()
    return 1
