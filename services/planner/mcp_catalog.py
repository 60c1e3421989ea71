"""A run's `mcp:` capabilities in its catalog, as an operator classified them (docs/design.md §11).

When a run starts, its snapshot's `mcp:` entries get the family, the description and the input
schema of the listing the operator classified (retrieval answers from the classification,
request/reply `writ.int.retrieval.mcp.catalog`), after the deploying operator's own words from
the manifest. Never the server's live text: a tool that changed since it was classified keeps
the classified description (its reads are refused anyway), and an unclassified one says only
that a person is asked each time. If retrieval does not answer, the entries stay as the
manifest has them; retrieval still checks every read's arguments before anything is sent.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
from nats.aio.client import Client

from libs.deadline import timed_request
from schemas import subjects
from schemas.mcp import DescribeTools, ToolDescriptions

__all__ = ["with_mcp_descriptions"]

log = logging.getLogger("writ.planner")

_DESCRIPTION_CHARS: Final = 2000
_DECODER: Final = msgspec.json.Decoder(ToolDescriptions)


async def with_mcp_descriptions(
    nc: Client, tenant: str, manifest: dict[str, Any] | None, *, timeout: float = 2.0
) -> dict[str, Any] | None:
    """The snapshot with its `mcp:` entries described as classified (unchanged without any)."""
    if manifest is None:
        return None
    entries = [e for e in manifest.get("catalog", []) if e.get("kind") == "mcp"]
    if not entries:
        return manifest
    ask = DescribeTools(tenant=tenant, capabilities=[e["name"] for e in entries][:64])
    try:
        reply = await timed_request(
            nc, subjects.MCP_CATALOG, msgspec.json.encode(ask), timeout=timeout
        )
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise RuntimeError(reply.headers.get("Nats-Service-Error"))
        described = {t.capability: t for t in _DECODER.decode(reply.data).tools}
    except Exception as exc:  # the manifest's own words still describe them
        log.warning("mcp: capabilities of %s not described: %r", tenant, exc)
        return manifest
    catalog = []
    for entry in manifest["catalog"]:
        if entry.get("kind") == "mcp":
            tool = described.get(entry["name"])
            entry = {**entry, "grants": dict(entry.get("grants", {}))}
            if tool is None:
                entry["grants"]["family"] = "unclassified: a person is asked every time"
            else:
                entry["description"] = (
                    f"{entry['description']}\nAs classified: {tool.description}"
                )[:_DESCRIPTION_CHARS]
                entry["inputs"] = tool.input_schema
                entry["grants"]["family"] = tool.family
        catalog.append(entry)
    return {**manifest, "catalog": catalog}
