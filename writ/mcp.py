"""Operators' commands for federation reads (`writ mcp ...`, docs/design.md §11).

- `add_server` registers a tenant's MCP server in the file retrieval reads
  (`config/mcp-servers.json` under the deployment's home, `WRIT_MCP_SERVERS_FILE`): its URL, the
  credential file (a secret only retrieval is given) and the tools Writ exposes.
- `list_server` has retrieval list the server now: the listing is hashed and journaled, and each
  tool is shown with its digest, where it stands (classified, unclassified, changed) and the
  server's annotations, printed as what they are: hints from an untrusted party.
- `show` has retrieval list the server now and prints one tool in full: its description, every
  parameter with its schema and description, the server's annotations, its digest and, for a
  tool that changed since it was classified, a diff against what was classified. All of it is
  the server's text, printed as such.
- `classify` records a tool's family and the operator's own description of it (the only words
  the model's instructions carry about it), bound to the digest the operator was shown: `show`
  first (the command shows it itself when no digest is given), and a tool listed differently
  since is refused. A tool whose description or schemas change afterwards is refused at its
  next call until classified again.
- `grant_pinned` gives an agent a standing grant for an MCP tool, or a server's tools, as they
  are classified now: one row per classified digest, so a definition the server changes later
  is asked again (a tenant's administrator's grant, written as provisioning writes them).
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import nats

from libs.deadline import timed_request
from libs.errors import ConfigError
from schemas import subjects
from schemas.base import Family, Tenant
from schemas.mcp import (
    ClassifyTool,
    ListedTool,
    ListServer,
    ServerListing,
    ServerName,
    ToolClassified,
)
from services.retrieval.mcp.servers import ServerConfig

__all__ = [
    "add_server",
    "classify",
    "grant_pinned",
    "list_server",
    "render_tool",
    "servers_file",
    "show_tool",
]


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
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    env_files: dict[str, str] | None = None,
    resources: dict[str, str] | None = None,
    auth_origins: list[str] | None = None,
) -> None:
    """Register (or replace) `server` for `tenant`.

    Raises:
        ConfigError: the registration is not valid (the message says what and how to fix it).
    """
    fields: dict[str, Any] = {
        "url": url,
        "credential_file": credential_file,
        "tools": tools,
        "facts": facts or {},
        "timeout_s": timeout_s,
        "transport": transport,
        "auth": auth,
        "command": command or [],
        "env": env or {},
        "env_files": env_files or {},
        "resources": resources or {},
        "auth_origins": auth_origins or [],
    }
    try:
        entry = msgspec.convert(fields, ServerConfig)
    except msgspec.ValidationError as exc:
        hint = (
            " (a local server is registered with --transport stdio --command '...', not a "
            "stdio: URL)"
            if url.startswith("stdio:")
            else ""
        )
        raise ConfigError(f"the registration of {server} is not valid: {exc}{hint}") from None
    if not _valid(tenant, Tenant):
        raise ConfigError(
            f"{tenant[:80]!r} is not a tenant's name (lower-case letters, digits and '-')"
        )
    if not _valid(server, ServerName):
        raise ConfigError(
            f"{server[:80]!r} is not a server's name: a lower-case letter, then up to 31 "
            "lower-case letters, digits or '-' (it is the <server> of mcp:<server>/<tool>)"
        )
    path = servers_file(home)
    try:
        current: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        msgspec.convert(current, _RegistrationFile)
    except (ValueError, msgspec.ValidationError) as exc:
        # Retrieval registers nothing from a file it cannot read: adding to it would not help.
        raise ConfigError(
            f"{path} is not a valid registration file ({str(exc)[:200]}): retrieval registers "
            "no server from it; mend or remove it first"
        ) from None
    current.setdefault(tenant, {})[server] = msgspec.to_builtins(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current, indent=2, sort_keys=True))
    os.replace(tmp, path)  # retrieval never reads half a file


# The registration file as retrieval reads it (services/retrieval/mcp/servers.py), tenants
# named as everywhere else.
_RegistrationFile = dict[Tenant, dict[ServerName, ServerConfig]]


def _valid(value: str, kind: Any) -> bool:
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError:
        return False
    return True


async def _quiet(exc: Exception) -> None:
    """A NATS client error the caller reports itself."""


async def _ask(
    nats_url: str, subject: str, message: msgspec.Struct, answer: type[Any], timeout: float
) -> Any:
    """One request to a service of the deployment.

    Raises:
        ConfigError: nothing answered, or the service refused the request (the message says
            which, never a traceback).
    """
    try:
        nc = await nats.connect(
            nats_url,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.2,
            connect_timeout=5,
            error_cb=_quiet,  # the one failure is said below, once, without its traceback
        )
    except Exception as exc:
        raise ConfigError(
            f"cannot reach Writ's bus at {nats_url or 'the default URL'}: is the deployment "
            f"running? ({type(exc).__name__})"
        ) from None
    try:
        reply = await timed_request(nc, subject, msgspec.json.encode(message), timeout=timeout)
    except Exception as exc:
        raise ConfigError(
            f"no answer on {subject} ({type(exc).__name__}): is retrieval running with "
            "WRIT_MCP_SERVERS_FILE set?"
        ) from None
    finally:
        await nc.close()
    if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
        raise ConfigError(f"refused: {reply.headers.get('Nats-Service-Error', '')}"[:500])
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
        for flag in tool.flags:
            print(f"    FLAGGED: {flag}")
    return listing


async def show_tool(
    nats_url: str,
    tenant: str,
    server: str,
    tool: str,
    *,
    quiet: bool = False,
    timeout: float = 30.0,
) -> ServerListing:
    """Have retrieval list `server` now (journaled) and print `tool` in full unless `quiet`."""
    listing: ServerListing = await _ask(
        nats_url,
        subjects.MCP_LIST,
        ListServer(tenant=tenant, server=server, tool=tool),
        ServerListing,
        timeout,
    )
    if not quiet:
        print(render_tool(server, tool, listing))
    return listing


def render_tool(server: str, tool: str, listing: ServerListing) -> str:
    """What an operator is shown of one tool before classifying it."""
    if not listing.ok:
        return f"{server}: {listing.error}"
    name = f"mcp:{server}/{tool}"
    status = next((t for t in listing.tools if t.name == tool), None)
    lines: list[str] = []
    shown, classified = listing.shown, listing.classified
    if shown is None:
        lines.append(f"{name}: the server does not list it now (it is never called)")
    else:
        state = status.state if status else "unclassified"
        family = f" as {status.family}" if status and status.family else ""
        exposed = "exposed" if tool in listing.exposed else "not exposed"
        lines += [
            f"{name}  {state}{family}, {exposed}",
            *(f"FLAGGED: {flag}" for flag in (status.flags if status else [])),
            f"digest {shown.digest}",
            "Everything below is the server's text: data from an untrusted party.",
            *_definition(shown),
        ]
        hints = {k: v for k, v in shown.hints.items() if v is not None}
        lines.append(
            "annotations (hints, decide nothing): "
            + (", ".join(f"{k}={v}" for k, v in sorted(hints.items())) or "-")
        )
    if classified is not None:
        lines.append(
            f"classified {classified.family} by {classified.classified_by or '?'} "
            f"(digest {classified.digest})"
        )
        if classified.operator_description:
            lines.append(f"operator's description: {classified.operator_description}")
        if shown is not None and classified.digest != shown.digest:
            was = _definition(
                ListedTool(
                    name=tool,
                    description=classified.description,
                    input_schema=classified.input_schema,
                    output_schema=classified.output_schema,
                    digest=classified.digest,
                )
            )
            lines.append("changed since it was classified:")
            lines += [
                "  " + d.rstrip("\n")
                for d in difflib.unified_diff(
                    was, _definition(shown), "classified", "listed now", lineterm="", n=2
                )
            ]
    if shown is not None:
        lines.append(
            f"to classify what is shown: writ mcp classify {server} {tool} --family FAMILY "
            f"--by YOU --digest {shown.digest} [--description 'your words for the model']"
        )
    return "\n".join(lines)


def _definition(tool: ListedTool) -> list[str]:
    """A tool's description, each parameter with its schema and description, its output."""
    lines = ["description:", *(f"  {line}" for line in (tool.description or "-").splitlines())]
    schema = tool.input_schema
    required = set(schema.get("required", [])) if isinstance(schema, dict) else set()
    params = schema.get("properties", {}) if isinstance(schema, dict) else {}
    lines.append("parameters:" if params else "parameters: none")
    for param, spec in params.items() if isinstance(params, dict) else []:
        spec = spec if isinstance(spec, dict) else {}
        text = {k: v for k, v in spec.items() if k not in ("description", "title")}
        lines.append(
            f"  {param}{' (required)' if param in required else ''}: "
            f"{json.dumps(text, sort_keys=True)}"
        )
        for key in ("title", "description"):
            if spec.get(key):
                lines.append(f"    {key}: {spec[key]}")
    rest = {k: v for k, v in schema.items() if k not in ("properties", "required")}
    lines.append(f"input schema, besides: {json.dumps(rest, sort_keys=True)}")
    lines.append(f"output schema: {json.dumps(tool.output_schema, sort_keys=True)}")
    return lines


async def classify(
    nats_url: str,
    tenant: str,
    server: str,
    tool: str,
    family: Family,
    by: str,
    *,
    digest: str | None = None,
    description: str = "",
    quiet: bool = False,
    timeout: float = 10.0,
) -> ToolClassified:
    """Record `tool`'s family and the operator's description, bound to `digest` (the one the
    operator was shown); without one, the tool is shown first and what was shown is bound."""
    if digest is None:
        listing = await show_tool(nats_url, tenant, server, tool, quiet=quiet)
        if not listing.ok or listing.shown is None:
            message = listing.error or f"{server} does not list {tool}: nothing to classify"
            if not quiet:
                print(message)
            return ToolClassified(ok=False, message=message[:500])
        digest = listing.shown.digest
    answer: ToolClassified = await _ask(
        nats_url,
        subjects.MCP_CLASSIFY,
        ClassifyTool(
            tenant=tenant,
            server=server,
            tool=tool,
            family=family,
            classified_by=by,
            digest=digest,
            description=description,
        ),
        ToolClassified,
        timeout,
    )
    if not quiet:
        print(answer.message)
    return answer


async def grant_pinned(
    dsn: str, tenant: str, agent: str, family: Family, source: str, by: str
) -> list[str]:
    """A standing grant of `agent` for `source` (`mcp:<server>/<tool>`, or `mcp:<server>/*` for
    each of that server's tools) in `family`, pinned to the digest of each tool classified into
    that family now; the digests granted (none: nothing is classified so)."""
    prefix = source[:-1] if source.endswith("/*") else None
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "INSERT INTO governance.standing_grants (tenant, agent, family, granted_by, source, "
            "digest) SELECT $1, $2, $3, $4, $5, t.digest FROM retrieval.mcp_tools t "
            "WHERE t.tenant = $1 AND t.family = $3 AND (t.capability = $5 OR ($6::text IS NOT "
            "NULL AND left(t.capability, length($6)) = $6)) ON CONFLICT DO NOTHING "
            "RETURNING digest",
            tenant,
            agent,
            family,
            by,
            source,
            prefix,
        )
    finally:
        await conn.close()
    return sorted(r["digest"] for r in rows)
