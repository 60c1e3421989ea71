"""`writ run`, scenario C (the agent-OS runtime view): a host product federates with Writ.

The simulated helpdesk (`fakes/host/`) keeps its data behind its own MCP server and its
writes behind its own REST API. An operator lists its MCP server and classifies the tools Writ
exposes; then the host starts a run through the SDK (`writ_client`), the agent reads a ticket
and its customer through `mcp:` tools, proposes a comment, which is admitted and dispatched over
REST; the host's own record shows exactly one comment. Each hop is printed as it happens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import nats

from fakes.host import drive_run
from schemas.base import Family
from writ import mcp
from writ.stack import Stack

__all__ = ["scenario_c"]

AGENT = "helpdesk-assistant"
INPUT = "Ticket T-1001 from Acme is about a late order: answer it."


def _line(started: float, what: str, detail: str) -> None:
    print(f"  {time.monotonic() - started:7.3f}s  {what:<18} {detail}", flush=True)


async def scenario_c(
    stack: Stack, started: float, describe: Callable[[str, bytes], tuple[str, str] | None]
) -> bool:
    """Play scenario C; True if the run succeeded and the host has exactly one comment."""
    print(
        f"\nScenario C: the host product at {stack.host_url} federates with Writ "
        "(reads over its MCP server, writes over its REST API)"
    )
    listing = await mcp.list_server(stack.nats_url, "acme", "helpdesk", quiet=True)
    if not listing.ok:
        print(f"  the host's MCP server could not be listed: {listing.error}")
        return False
    _line(
        started,
        "listed",
        f"operator: mcp:helpdesk lists {len(listing.tools)} tools, "
        f"listing {listing.digest[:12]}… journaled",
    )
    classes: tuple[tuple[str, Family], ...] = (
        ("ticket.get", "read"),
        ("customer.get", "read_personal"),
    )
    for tool, family in classes:
        answer = await mcp.classify(
            stack.nats_url, "acme", "helpdesk", tool, family, "ops@acme.example", quiet=True
        )
        _line(started, "classified", f"operator: {answer.message}")
    # The helpdesk agent reads customers without asking: its administrator's grant for
    # customer.get as classified just now (a changed definition would be asked again).
    pinned = await mcp.grant_pinned(
        stack.database_dsn,
        "acme",
        AGENT,
        "read_personal",
        "mcp:helpdesk/customer.get",
        "admin@acme.example",
    )
    _line(
        started,
        "granted",
        f"administrator: {AGENT} may read mcp:helpdesk/customer.get as pinned "
        f"({', '.join(d[:12] + '…' for d in pinned) or 'already granted'})",
    )
    _line(
        started,
        "unclassified",
        "mcp:helpdesk/tickets.search: nobody classified it, so it would be asked every time",
    )

    nc = await nats.connect(stack.nats_url)

    async def watch(msg: Any) -> None:
        described = _federation(msg.subject, msg.data) or describe(msg.subject, msg.data)
        if described is not None:
            _line(started, *described)

    sub = await nc.subscribe("writ.>", cb=watch)
    try:
        _line(
            started,
            "host",
            f"the helpdesk asks Writ: POST {stack.api_url}/runs (writ_client), agent {AGENT}",
        )
        result = await drive_run(
            stack.api_url,
            tenant="acme",
            issuer=stack.issuer("acme"),
            private_key_pem=stack.host_key("acme"),
            principal="alice@acme.example",
            agent=AGENT,
            text=INPUT,
        )
        await nc.flush()
    finally:
        await sub.unsubscribe()
        await nc.close()
    async with httpx.AsyncClient(base_url=stack.host_url, timeout=5) as client:
        state = (await client.get("/_control/state")).json()
    comments = [c for c in state["comments"] if c["ticket_id"] == "T-1001"]
    for c in comments:
        _line(
            started,
            "host record",
            f"ticket T-1001 has comment {c['comment_id']} "
            f"(Idempotency-Key {c['idempotency_key'][:18]}…), "
            f"revision {state['tickets']['T-1001']['revision']}",
        )
    ok = result.status == "succeeded" and len(comments) == 1
    print(f"  scenario C: {'one comment at the host, as asked' if ok else 'FAILED'}")
    return ok


def _federation(subject: str, data: bytes) -> tuple[str, str] | None:
    try:
        body: dict[str, Any] = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(body, dict):
        return None
    kind = body.get("type")
    if kind == "RecordListing":
        return "listing", (
            f"retrieval listed mcp:{body['server']} ({len(body['tools'])} "
            f"tools, {body['digest'][:12]}…): recorded in the journal"
        )
    if kind == "ReadFacts" and subject.endswith("retrieval.facts"):
        return "facts", (
            f"admission reads {body['kind']} {body['id']} through retrieval (MCP) for the preview"
        )
    return None
