"""The path every `mcp:<server>/<tool>` read takes, in order, and nothing is sent before its end:

1. the server is registered for the run's tenant and the tool is one Writ exposes;
2. the arguments are within Writ's own bounds and the input schema the operator classified;
3. the tool's breaker admits the call (only transient failures count);
4. the server lists its tools now, in the session the call will be made in (no listing is
   kept between reads: a tool changed a moment ago is seen changed by the very next call), and
   the listing — every tool's digest and the whole listing's — is recorded by governance in its
   journal;
5. the tool is in that listing (a tool never listed is never called);
6. the arguments validate against the listed input schema (a real JSON Schema validator);
7. governance's `decide` allows it, given the tool's live digest: an unclassified tool is asked
   every time, a changed one refused until an operator classifies it again;
8. the call, under the registration's timeout; its result, bounded, is untrusted content.

Writes never go through here: only read tools are exposed, and no annotation changes that.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from itertools import islice
from typing import Any, Final

import jsonschema
import mcp_types as types
import msgspec
from nats.aio.client import Client as Nats

from libs.breaker import Breakers, BreakerState
from libs.deadline import timed_request
from libs.decide import DecideUnavailable, decide
from schemas import subjects
from schemas.dispatcher import FactsRead, ReadFacts
from schemas.governance import DecideRequest, Decision
from schemas.mcp import (
    MAX_LISTED_TOOLS,
    ClassifiedTool,
    ListedTool,
    ListingRecorded,
    ListServer,
    RecordListing,
    RegisteredServer,
    RegisteredServers,
    ServerListing,
    ToolStatus,
    capability,
    parse_capability,
)
from schemas.retrieval import ReadCapability, ReadItem, ReadRefused, ReadResult
from services.retrieval.mcp.client import (
    McpClient,
    McpCredentialRefused,
    McpSession,
    McpUnavailable,
)
from services.retrieval.mcp.digest import listing_digest, tool_digest
from services.retrieval.mcp.servers import ServerConfig, ServerRegistry

__all__ = ["MAX_ARGUMENT_BYTES", "MAX_RESULT_CHARS", "McpReads"]

log = logging.getLogger("writ.retrieval")

MAX_ARGUMENT_BYTES: Final = 4096
MAX_RESULT_CHARS: Final = 8000
_MAX_DESCRIPTION: Final = 4000
_MAX_SCHEMA_BYTES: Final = 16 * 1024
# The argument that names the record, per kind of facts a registration may read.
_FACT_ARGUMENT: Final = {"host_ticket": "ticket_id"}


class _Listing(msgspec.Struct, frozen=True, kw_only=True):
    digest: str
    tools: dict[str, ListedTool]
    status: dict[str, ToolStatus]


class _Refusal(Exception):
    """The read stops here with this answer's code and reason."""

    def __init__(
        self, code: str, reason: str, *, retryable: bool = False, decision: Decision | None = None
    ) -> None:
        super().__init__(reason)
        self.code, self.reason, self.retryable, self.decision = code, reason, retryable, decision


class McpReads:
    """Executes `mcp:` reads, lists servers for operators, reads host facts for admission."""

    def __init__(
        self,
        *,
        nc: Nats,
        servers: ServerRegistry,
        classified: Callable[[str, str], Awaitable[ClassifiedTool | None]],
        client: McpClient | None = None,
        decide_timeout_s: float = 2.0,
        breaker_cooldown_s: float = 30.0,
        on_breaker: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        self._nc, self._servers, self._client = nc, servers, client or McpClient()
        self._classified = classified
        self._decide_timeout = decide_timeout_s
        self._breakers = Breakers(threshold=3, cooldown_s=breaker_cooldown_s, on_change=on_breaker)
        self._encoder = msgspec.json.Encoder()
        self._recorded = msgspec.json.Decoder(ListingRecorded)

    # -- reads ------------------------------------------------------------------------------

    async def read(self, ask: ReadCapability) -> ReadResult | ReadRefused:
        """One governed `mcp:` read for a run."""
        try:
            return await self._read(ask)
        except _Refusal as r:
            d = r.decision
            return ReadRefused(
                run_id=ask.run_id,
                tool=ask.tool,
                code=r.code,  # type: ignore[arg-type]
                reason=r.reason[:500],
                retryable=r.retryable,
                decision_id=d.decision_id if d else None,
                pending_id=d.pending_id if d else None,
                line=d.line if d else None,
            )

    async def _read(self, ask: ReadCapability) -> ReadResult:
        server_name, tool_name = self._target(ask.tool)
        server = self._registered(ask.tenant, server_name, tool_name)
        if len(self._encoder.encode(ask.arguments)) > MAX_ARGUMENT_BYTES:
            raise _Refusal(
                "INVALID_ARGUMENTS", f"{ask.tool}: arguments over {MAX_ARGUMENT_BYTES} bytes"
            )
        # Against the schema the operator classified, before any request leaves (the live one
        # is checked again once listed: an unclassified tool has only that one).
        try:
            classified = await self._classified(ask.tenant, ask.tool)
        except Exception as exc:
            raise _Refusal(
                "UNAVAILABLE", f"{ask.tool}: its classification cannot be read now", retryable=True
            ) from exc
        if classified is not None:
            _validate(ask.tool, classified.input_schema, ask.arguments)
        breaker = self._breakers.for_tool(ask.tool)
        admission = breaker.admit()
        if not admission.allowed:
            raise _Refusal(
                "UNAVAILABLE",
                f"{ask.tool} failed repeatedly: its breaker is open "
                f"for {admission.retry_after_s:.0f} s more",
                retryable=True,
            )
        outcome = "neutral"

        async def work(session: McpSession) -> ReadResult:
            nonlocal outcome
            listing = await self._listing(session, ask.tenant, server_name, server)
            tool = self._listed(listing, ask.tool, tool_name)
            _validate(ask.tool, tool.input_schema, ask.arguments)
            decision = await self._decide(ask, tool.digest)
            if decision.verdict != "allow":
                changed = classified is not None and classified.digest != tool.digest
                raise _Refusal(
                    "CHANGED"
                    if changed and decision.verdict == "deny"
                    else "DENIED"
                    if decision.verdict == "deny"
                    else "ASK",
                    decision.reason,
                    decision=decision,
                )
            if tool_name in server.resources:
                contents = await session.read_resource(server.resources[tool_name])
                outcome = "success"
                items, truncated = _resource_items(ask.tool, tool_name, contents)
            else:
                result = await session.call_tool(tool_name, dict(ask.arguments))
                outcome = "success"
                items, truncated = _items(ask.tool, tool_name, result)
            return ReadResult(
                run_id=ask.run_id,
                tool=ask.tool,
                decision_id=decision.decision_id,
                items=items,
                truncated=truncated,
            )

        try:
            return await self._client.session(server, work)
        except McpCredentialRefused as exc:
            raise _Refusal("UNAVAILABLE", f"{ask.tool}: {exc}; nothing was read") from exc
        except McpUnavailable as exc:
            outcome = "transient"
            raise _Refusal(
                "UNAVAILABLE", f"{ask.tool}: {exc}; nothing was read", retryable=True
            ) from exc
        finally:
            breaker.record(admission, outcome)  # type: ignore[arg-type]

    def _target(self, name: str) -> tuple[str, str]:
        target = parse_capability(name)
        if target is None:
            raise _Refusal("UNKNOWN_TOOL", f"{name[:128]} is not an mcp:<server>/<tool> name")
        return target

    def _registered(self, tenant: str, server_name: str, tool_name: str) -> ServerConfig:
        server = self._servers.get(tenant, server_name)
        if server is None:
            raise _Refusal("UNKNOWN_TOOL", self._servers.unregistered(tenant, server_name))
        if tool_name not in server.tools and tool_name not in server.resources:
            raise _Refusal(
                "UNKNOWN_TOOL",
                f"{tool_name} is not a tool or resource Writ exposes from {server_name}",
            )
        return server

    def _listed(self, listing: _Listing, name: str, tool_name: str) -> ListedTool:
        tool = listing.tools.get(tool_name)
        if tool is None:
            raise _Refusal(
                "UNLISTED",
                f"{name}: the server does not list {tool_name}; a tool "
                "that was never listed is never called",
            )
        return tool

    async def _decide(self, ask: ReadCapability, digest: str) -> Decision:
        values = [v for v in ask.arguments.values() if isinstance(v, str | int | float)]
        request = DecideRequest(
            tenant=ask.tenant,
            principal=ask.principal,
            agent=ask.agent,
            run_id=ask.run_id,
            tool=ask.tool,
            first_argument=str(values[0])[:512] if values else "",
            approval_id=ask.approval_id,
            tool_digest=digest,
        )
        try:
            return await decide(self._nc, request, timeout=self._decide_timeout)
        except DecideUnavailable as exc:  # no answer is not an allow
            raise _Refusal("UNAVAILABLE", str(exc), retryable=True) from exc

    # -- listings ---------------------------------------------------------------------------

    async def _listing(
        self, session: McpSession, tenant: str, server: str, config: ServerConfig | None = None
    ) -> _Listing:
        """The server's tools, listed now in `session` (the one any call will be made in):
        no listing outlives the session, so neither a `notifications/tools/list_changed` nor a
        reconnect can leave Writ holding a definition the server no longer serves. Every
        listing is recorded by governance before it is used."""
        served = (await session.list_tools())[: MAX_LISTED_TOOLS * 16]
        wanted = set(config.tools) if config is not None else set()
        # What Writ exposes first, then the rest: a listing keeps 64, and a server listing
        # more (or placing the exposed ones late) must not push an exposed tool out of it.
        tools = [_listed(t) for t in served if t.name in wanted][:MAX_LISTED_TOOLS]
        if config is not None and config.resources:
            # The exposed resources the server lists now, each as a tool of its name: hashed,
            # journaled and classified like one (a changed or unlisted resource is refused).
            exposed = {uri: name for name, uri in config.resources.items()}
            tools += [
                _listed_resource(exposed[str(r.uri)], r)
                for r in (await session.list_resources())[: MAX_LISTED_TOOLS * 4]
                if str(r.uri) in exposed
            ][: MAX_LISTED_TOOLS - len(tools)]
        rest = (_listed(t) for t in served if t.name not in wanted)
        tools += islice(rest, max(MAX_LISTED_TOOLS - len(tools), 0))
        digest = listing_digest((t.name, t.digest) for t in tools)
        recorded = await self._record(
            RecordListing(tenant=tenant, server=server, digest=digest, tools=tools)
        )
        return _Listing(
            digest=digest,
            tools={t.name: t for t in tools},
            status={s.name: s for s in recorded.tools},
        )

    async def _record(self, listing: RecordListing) -> ListingRecorded:
        try:
            reply = await timed_request(
                self._nc,
                subjects.MCP_LISTING,
                self._encoder.encode(listing),
                timeout=self._decide_timeout,
            )
        except Exception as exc:
            # A listing nobody recorded is not used: the journal must have what was relied on.
            raise _Refusal(
                "UNAVAILABLE",
                f"governance did not record the listing of {listing.server}: {exc!r}"[:300],
                retryable=True,
            ) from exc
        if reply.headers and reply.headers.get("Nats-Service-Error-Code"):
            raise _Refusal(
                "UNAVAILABLE",
                f"governance did not record the listing of {listing.server}",
                retryable=True,
            )
        return self._recorded.decode(reply.data)

    def registered(self, tenant: str) -> RegisteredServers:
        """The tenant's registered servers, as an operator chooses among them (no server is
        asked anything; no address, command or credential is given)."""
        servers = []
        for name in self._servers.names(tenant):
            config = self._servers.get(tenant, name)
            if config is not None:
                exposed = sorted({*config.tools, *config.resources})
                servers.append(
                    RegisteredServer(name=name, transport=config.transport, exposed=exposed)
                )
        return RegisteredServers(servers=servers, error=self._servers.refusal())

    async def list_server(self, ask: ListServer) -> ServerListing:
        """List a registered server now, for an operator (recorded like every listing)."""
        server = self._servers.get(ask.tenant, ask.server)
        if server is None:
            return ServerListing(ok=False, error=self._servers.unregistered(ask.tenant, ask.server))

        async def work(session: McpSession) -> _Listing:
            return await self._listing(session, ask.tenant, ask.server, server)

        try:
            listing = await self._client.session(server, work)
        except (McpUnavailable, _Refusal) as exc:
            return ServerListing(ok=False, error=str(exc)[:500])
        shown = classified = None
        if ask.tool is not None:
            shown = listing.tools.get(ask.tool)
            try:
                classified = await self._classified(ask.tenant, capability(ask.server, ask.tool))
            except Exception as exc:
                return ServerListing(ok=False, error=f"the classification cannot be read: {exc}")
            if shown is None and classified is None:
                return ServerListing(
                    ok=False,
                    error=f"{ask.server} does not list {ask.tool} and nobody classified it",
                )
        return ServerListing(
            ok=True,
            digest=listing.digest,
            tools=list(listing.status.values()),
            exposed=[*server.tools, *server.resources],
            shown=shown,
            classified=classified,
        )

    # -- facts ------------------------------------------------------------------------------

    async def facts(self, ask: ReadFacts) -> FactsRead:
        """A host record a preview stands on (admission's, at proposal time), read with the
        tool the registration names for it. Writ's own read, with arguments built by code, not
        a model's call: it needs no `decide`, but the tool must be listed now and classified
        as it is, like any other.

        Raises:
            RuntimeError: it cannot be read now (admission retries the proposal).
        """
        for name in self._servers.names(ask.tenant):
            server = self._servers.get(ask.tenant, name)
            if server is None or ask.kind not in server.facts or ask.kind not in _FACT_ARGUMENT:
                continue
            tool_name = server.facts[ask.kind]

            async def work(session: McpSession) -> FactsRead:
                listing = await self._listing(session, ask.tenant, name)  # noqa: B023
                tool = listing.tools.get(tool_name)  # noqa: B023
                classified = await self._classified(ask.tenant, capability(name, tool_name))  # noqa: B023
                if tool is None or classified is None or classified.digest != tool.digest:
                    state = (
                        "not listed"
                        if tool is None
                        else "unclassified"
                        if classified is None
                        else "changed since it was classified"
                    )
                    raise RuntimeError(f"mcp:{name}/{tool_name} is {state}")  # noqa: B023
                result = await session.call_tool(
                    tool_name,  # noqa: B023
                    {_FACT_ARGUMENT[ask.kind]: ask.id},
                )
                if result.is_error or not isinstance(result.structured_content, dict):
                    return FactsRead(found=False)
                record = {
                    k: v
                    for k, v in list(result.structured_content.items())[:64]
                    if isinstance(v, str | int | float | bool)
                }
                return FactsRead(
                    found=True,
                    facts={k: v[:512] if isinstance(v, str) else v for k, v in record.items()},
                )

            try:
                return await self._client.session(server, work)
            except (McpUnavailable, _Refusal) as exc:
                raise RuntimeError(f"the host record could not be read: {exc}") from exc
        raise RuntimeError(f"no MCP server of {ask.tenant} reads {ask.kind} records")


def _listed(tool: types.Tool) -> ListedTool:
    description = (tool.description or "")[:_MAX_DESCRIPTION]
    schema = (
        tool.input_schema
        if len(json.dumps(tool.input_schema)) <= _MAX_SCHEMA_BYTES
        else {"type": "object", "x-writ-refused": "schema over 16 KiB"}
    )
    output = tool.output_schema
    if output is not None and len(json.dumps(output)) > _MAX_SCHEMA_BYTES:
        output = {"x-writ-refused": "schema over 16 KiB"}
    hints: dict[str, bool | str | None] = {}
    if tool.annotations is not None:
        for key in ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"):
            hints[key] = getattr(tool.annotations, key)
        if tool.annotations.title:
            hints["annotation_title"] = tool.annotations.title[:200]
    if tool.title:
        hints["title"] = tool.title[:200]
    return ListedTool(
        name=tool.name[:64],
        description=description,
        input_schema=schema,
        output_schema=output,
        hints=hints,
        digest=tool_digest(
            tool.name, tool.description or "", tool.input_schema, tool.output_schema
        ),
    )


# What a resource read takes: nothing (the URI is the registration's).
_NO_ARGUMENTS: Final = {"type": "object", "additionalProperties": False, "properties": {}}


def _listed_resource(name: str, resource: types.Resource) -> ListedTool:
    """An exposed resource as listed, under its registered name: its URI, name and type are
    hashed with its description, so a resource changed on the server is seen changed."""
    described = {"uri": str(resource.uri), "name": resource.name, "mimeType": resource.mime_type}
    hints: dict[str, bool | str | None] = {
        "resource_uri": str(resource.uri)[:500],
        "mime_type": resource.mime_type,
    }
    if resource.title:
        hints["title"] = resource.title[:200]
    return ListedTool(
        name=name,
        description=(resource.description or "")[:_MAX_DESCRIPTION],
        input_schema=_NO_ARGUMENTS,
        hints=hints,
        digest=tool_digest(name, resource.description or "", {"resource": described}, None),
    )


def _resource_items(
    capability: str, name: str, result: types.ReadResourceResult
) -> tuple[list[ReadItem], bool]:
    """A resource's contents as one bounded, untrusted item (text; a blob is only sized)."""
    parts = [
        c.text
        if isinstance(c, types.TextResourceContents)
        else f"[{c.mime_type or 'binary'} content, {len(c.blob) * 3 // 4} bytes, not shown]"
        for c in result.contents
    ]
    text = "\n".join(parts)
    truncated = len(text) > MAX_RESULT_CHARS
    return [
        ReadItem(
            id=name[:128], kind="mcp_resource", title=capability[:512], text=text[:MAX_RESULT_CHARS]
        )
    ], truncated


def _validate(name: str, schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    try:
        validator = jsonschema.Draft202012Validator(schema)
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        reason = f"{name}: the server's input schema is not a JSON Schema ({exc.message[:200]})"
        raise _Refusal("INVALID_ARGUMENTS", f"{reason}; nothing was sent") from exc
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is not None:
        where = "$" + "".join(
            f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
        )
        raise _Refusal(
            "INVALID_ARGUMENTS", f"{name}: {where}: {error.message[:300]}; nothing was sent"
        )


def _items(capability: str, tool: str, result: types.CallToolResult) -> tuple[list[ReadItem], bool]:
    """The result as one bounded, untrusted item: the structured content, else the text."""
    if result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True)
    else:
        text = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
    kind = "mcp_error" if result.is_error else "mcp_result"
    truncated = len(text) > MAX_RESULT_CHARS
    return [
        ReadItem(id=tool[:128], kind=kind, title=capability[:512], text=text[:MAX_RESULT_CHARS])
    ], truncated
