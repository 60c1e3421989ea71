"""Operators' commands for federation reads (`writ mcp ...`, docs/design.md §11).

- `add_server` registers a tenant's MCP server in the file retrieval reads
  (`config/mcp-servers.json` under the deployment's home, `WRIT_MCP_SERVERS_FILE`): its URL, the
  credential file (a secret only retrieval is given) and the tools Writ exposes.
- `list_server` has retrieval list the server now: the listing is hashed and journaled, and each
  tool is shown with its digest, where it stands (classified, unclassified, changed) and the
  server's annotations, printed as what they are: hints from an untrusted party.
- `classify` records a tool's family, bound to the digest of the latest recorded listing; a tool
  whose description or schemas change afterwards is refused until classified again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec
import nats

from libs.deadline import timed_request
from schemas import subjects
from schemas.base import Family
from schemas.mcp import ClassifyTool, ListServer, ServerListing, ToolClassified
from services.retrieval.mcp.servers import ServerConfig

__all__ = ["add_server", "classify", "list_server", "servers_file"]


def servers_file(home: Path) -> Path:
    """The MCP servers file of a local deployment."""
    return home / "config" / "mcp-servers.json"


def add_server(
    home: Path,
    tenant: str,
    server: str,
    *,
    url: str,
    credential_file: str,
    tools: list[str],
    facts: dict[str, str] | None = None,
    timeout_s: float = 10.0,
    transport: str = "auto",
    auth: str = "bearer",
) -> None:
    """Register (or replace) `server` for `tenant`.

    Raises:
        msgspec.ValidationError: the registration is not valid.
    """
    entry = msgspec.convert(
        {
            "url": url,
            "credential_file": credential_file,
            "tools": tools,
            "facts": facts or {},
            "timeout_s": timeout_s,
            "transport": transport,
            "auth": auth,
        },
        ServerConfig,
    )
    path = servers_file(home)
    current: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    current.setdefault(tenant, {})[server] = msgspec.to_builtins(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True))
    os.replace(tmp, path)  # retrieval never reads half a file


async def _ask(
    nats_url: str, subject: str, message: msgspec.Struct, answer: type[Any], timeout: float
) -> Any:
    nc = await nats.connect(nats_url)
    try:
        reply = await timed_request(nc, subject, msgspec.json.encode(message), timeout=timeout)
    finally:
        await nc.close()
    return msgspec.json.decode(reply.data, type=answer)


async def list_server(
    nats_url: str, tenant: str, server: str, *, quiet: bool = False, timeout: float = 30.0
) -> ServerListing:
    """Have retrieval list `server` now (journaled); print each tool unless `quiet`."""
    listing: ServerListing = await _ask(
        nats_url,
        subjects.MCP_LIST,
        ListServer(tenant=tenant, server=server),
        ServerListing,
        timeout,
    )
    if quiet:
        return listing
    if not listing.ok:
        print(f"{server}: {listing.error}")
        return listing
    print(f"{server}: listing {listing.digest[:12]} recorded")
    for tool in listing.tools:
        exposed = "exposed" if tool.name in listing.exposed else "not exposed"
        family = f" as {tool.family}" if tool.family else ""
        hints = ", ".join(f"{k}={v}" for k, v in tool.hints.items() if v is not None)
        print(
            f"  mcp:{server}/{tool.name}  {tool.state}{family}, {exposed}, "
            f"digest {tool.digest[:12]}\n    server hints (untrusted): {hints or '-'}"
        )
    return listing


async def classify(
    nats_url: str,
    tenant: str,
    server: str,
    tool: str,
    family: Family,
    by: str,
    *,
    quiet: bool = False,
    timeout: float = 10.0,
) -> ToolClassified:
    """Record `tool`'s family as the latest recorded listing describes it."""
    answer: ToolClassified = await _ask(
        nats_url,
        subjects.MCP_CLASSIFY,
        ClassifyTool(tenant=tenant, server=server, tool=tool, family=family, classified_by=by),
        ToolClassified,
        timeout,
    )
    if not quiet:
        print(answer.message)
    return answer
