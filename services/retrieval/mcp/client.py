"""One MCP session with a registered server, with the official SDK, over the transports the
SDK speaks: Streamable HTTP, the legacy HTTP+SSE one (GET an event stream, POST to the
endpoint it names), or stdio (a trusted local server run as a child of retrieval for the
session's length, with exactly the environment its registration names, killed if retrieval
dies). `auto` registrations try Streamable HTTP and fall back to SSE when the
server answers that first POST with a 4xx other than 401/403, as the spec's backwards-
compatibility section says; the fallback happens before any tool is listed or called.

Over Streamable HTTP the SDK negotiates the protocol era (`mode="auto"`: the handshake era or
the modern one); over SSE it is the handshake era (`mode="legacy"`). The SDK's
response cache is off: every listing is the server's answer now, never a remembered one.
Each call is bounded by the registration's timeout. Errors come out as two kinds: the server
refused Writ's credential (`McpCredentialRefused`: an operator must fix it, retrying changes
nothing) or it could not be reached or answered badly (`McpUnavailable`: transient, counted by
the tool's breaker).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from services.retrieval.mcp.oauth import McpTokenError, Tokens
from services.retrieval.mcp.servers import ServerConfig

__all__ = ["McpClient", "McpCredentialRefused", "McpMisconfigured", "McpSession", "McpUnavailable"]

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


class McpUnavailable(Exception):
    """The server could not be reached, timed out or answered badly: transient."""


class McpCredentialRefused(McpUnavailable):
    """The server refused the credential (401/403): not transient, an operator must act."""


class McpMisconfigured(McpCredentialRefused):
    """The registration cannot be used as it is (a stdio command not found, a secret file
    unreadable): not transient, an operator must act."""


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries, looking inside exception groups."""
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (status := _status_of(inner)) is not None:
                return status
    for attr in ("__cause__", "__context__"):
        inner = getattr(exc, attr, None)
        if inner is not None and inner is not exc and (status := _status_of(inner)):
            return status
    return None


def _mapped(exc: BaseException) -> McpUnavailable:
    status = _status_of(exc)
    if status in (401, 403):
        return McpCredentialRefused(f"the MCP server refused Writ's credential (HTTP {status})")
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    detail = f"HTTP {status}" if status else f"{type(leaf).__name__}: {leaf}"[:200]
    return McpUnavailable(f"the MCP server did not answer ({detail})")


class McpSession:
    """An open session: list the tools and resources, call a tool, read a resource."""

    def __init__(self, client: Client, timeout_s: float) -> None:
        self._client, self._timeout = client, timeout_s

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the server lists now (all pages)."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self._timeout):
                for _ in range(16):  # a server paging for ever is a server not answering
                    page = await self._client.list_tools(cursor=cursor)
                    tools += page.tools
                    if not (cursor := page.next_cursor):
                        break
        except Exception as exc:
            raise _mapped(exc) from exc
        return tools

    async def list_resources(self) -> list[types.Resource]:
        """Every resource the server lists now (all pages)."""
        resources: list[types.Resource] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self._timeout):
                for _ in range(16):
                    page = await self._client.list_resources(cursor=cursor)
                    resources += page.resources
                    if not (cursor := page.next_cursor):
                        break
        except Exception as exc:
            raise _mapped(exc) from exc
        return resources

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """Read one resource Writ checked was listed."""
        try:
            with anyio.fail_after(self._timeout):
                result = await self._client.read_resource(uri)
        except Exception as exc:
            raise _mapped(exc) from exc
        if not isinstance(result, types.ReadResourceResult):
            raise McpUnavailable(f"{uri[:200]} answered {type(result).__name__}, not contents")
        return result

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call one tool with arguments already checked."""
        try:
            with anyio.fail_after(self._timeout):
                result = await self._client.call_tool(name, arguments)
        except Exception as exc:
            raise _mapped(exc) from exc
        if not isinstance(result, types.CallToolResult):
            raise McpUnavailable(f"{name} answered {type(result).__name__}, not a tool result")
        return result


class _LegacyOnly(Exception):
    """The server answered the Streamable HTTP POST with a 4xx that is not about the
    credential, before any work: the spec says to try the legacy HTTP+SSE transport."""


class McpClient:
    """Opens sessions with registered servers, with each one's credential, over the transport
    the registration names (`auto`: Streamable HTTP, else legacy HTTP+SSE)."""

    def __init__(self) -> None:
        self._tokens = Tokens()

    async def session(self, server: ServerConfig, work: Callable[[McpSession], Awaitable[T]]) -> T:
        """Open a session with `server`, run `work` in it, close it; `work`'s own errors pass
        through. The whole exchange is bounded by a few of the server's timeouts.

        Raises:
            McpUnavailable: the session failed (`McpCredentialRefused` for 401/403).
        """
        if server.transport == "stdio":
            return await self._stdio(server, work)
        try:
            return await self._with_transport(server, work, await self._bearer(server))
        except _StaleToken:
            # A cached access token the server no longer takes (revoked, expired early): one
            # fresh one, before anything was listed or called; refused again is refused.
            self._tokens.forget(server)
            return await self._with_transport(server, work, await self._bearer(server), fresh=True)

    async def _stdio(self, server: ServerConfig, work: Callable[[McpSession], Awaitable[T]]) -> T:
        """A session with a local server run as a child of this process for the session's
        length: its environment is exactly the registration's (`env -i`), and it is killed
        if retrieval dies (`setpriv --pdeathsig`, where there is one; otherwise its stdin
        closing ends it, as the stdio transport says)."""
        try:
            env = server.environment()
        except ValueError as exc:
            raise McpMisconfigured(f"the stdio server's environment: {exc}"[:300]) from exc
        program = shutil.which(server.command[0])
        if program is None:
            raise McpMisconfigured(f"the stdio command {server.command[0][:200]!r} is not found")
        argv = [
            "-i",
            *(f"{k}={v}" for k, v in sorted(env.items())),
            program,
            *server.command[1:],
        ]
        launcher = shutil.which("env") or "/usr/bin/env"
        setpriv = shutil.which("setpriv")
        params = (
            StdioServerParameters(command=setpriv, args=["--pdeathsig", "KILL", launcher, *argv])
            if setpriv is not None and sys.platform == "linux"
            else StdioServerParameters(command=launcher, args=argv)
        )
        own: list[BaseException] = []

        async def run(session: McpSession) -> T:
            try:
                return await work(session)
            except McpUnavailable:
                raise
            except Exception as exc:  # not the SDK's: hand it back unchanged
                own.append(exc)
                raise

        try:
            with anyio.fail_after(server.timeout_s * 3):
                async with Client(stdio_client(params), cache=None, mode="auto") as client:
                    return await run(McpSession(client, server.timeout_s))
        except McpUnavailable:
            raise
        except Exception as exc:
            if own:
                raise own[0] from None
            raise (_first(exc, McpUnavailable) or _mapped(exc)) from exc

    async def _bearer(self, server: ServerConfig) -> tuple[str, bool]:
        """The bearer for `server` and whether it came from the token cache."""
        if server.auth == "bearer":
            try:
                return server.credential(), False
            except ValueError as exc:
                raise McpCredentialRefused(str(exc)) from exc
        try:
            return await self._tokens.get(server)
        except McpTokenError as exc:
            raise (McpCredentialRefused if exc.refused else McpUnavailable)(str(exc)) from exc

    async def _with_transport(
        self,
        server: ServerConfig,
        work: Callable[[McpSession], Awaitable[T]],
        bearer: tuple[str, bool],
        *,
        fresh: bool = False,
    ) -> T:
        token, cached = bearer
        cached = cached and not fresh
        if server.transport == "sse":
            return await self._session(server, work, token, legacy=True, probe=False, cached=cached)
        try:
            return await self._session(
                server, work, token, legacy=False, probe=server.transport == "auto", cached=cached
            )
        except _LegacyOnly:
            # Nothing was sent but the handshake: no read can happen twice.
            return await self._session(server, work, token, legacy=True, probe=False, cached=cached)

    async def _session(
        self,
        server: ServerConfig,
        work: Callable[[McpSession], Awaitable[T]],
        token: str,
        *,
        legacy: bool,
        probe: bool,
        cached: bool,
    ) -> T:
        headers = {"Authorization": f"Bearer {token}"}
        timeout = httpx2.Timeout(server.timeout_s, connect=min(server.timeout_s, 3.0))
        own: list[BaseException] = []
        started = False
        # The SDK turns an HTTP error into a JSON-RPC "internal error" without its status:
        # the client's own hook keeps the statuses that say the credential was refused or the
        # server does not speak Streamable HTTP.
        refused: list[int] = []
        rejected: list[int] = []

        async def watch(response: httpx2.Response) -> None:
            if response.status_code in (401, 403):
                refused.append(response.status_code)
            elif 400 <= response.status_code < 500:
                rejected.append(response.status_code)

        def http_client(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            http = create_mcp_http_client(headers=headers, timeout=timeout, auth=auth)
            http.event_hooks["response"].append(watch)
            return http

        async def run(session: McpSession) -> T:
            nonlocal started
            started = True
            try:
                return await work(session)
            except McpUnavailable:
                raise
            except Exception as exc:  # not the SDK's: hand it back unchanged
                own.append(exc)
                raise

        try:
            with anyio.fail_after(server.timeout_s * 3):
                if legacy:
                    transport = sse_client(
                        server.url,
                        headers=headers,
                        timeout=server.timeout_s,
                        sse_read_timeout=server.timeout_s * 3,
                        httpx_client_factory=http_client,
                    )
                    async with Client(transport, cache=None, mode="legacy") as client:
                        return await run(McpSession(client, server.timeout_s))
                http = http_client(headers=headers, timeout=timeout)
                async with (
                    http,
                    Client(
                        streamable_http_client(server.url, http_client=http),
                        cache=None,
                        mode="auto",
                    ) as client,
                ):
                    return await run(McpSession(client, server.timeout_s))
        except McpUnavailable:
            raise
        except BaseException as exc:
            if own:
                raise own[0] from None
            if isinstance(exc, Exception | BaseExceptionGroup) and not isinstance(
                exc, anyio.get_cancelled_exc_class()
            ):
                if refused and cached and not started:
                    raise _StaleToken from exc
                if refused:
                    raise McpCredentialRefused(
                        f"the MCP server refused Writ's credential (HTTP {refused[0]})"
                    ) from exc
                if probe and rejected and not started:
                    raise _LegacyOnly from exc
                mcp_error = _first(exc, McpUnavailable)
                raise (mcp_error or _mapped(exc)) from exc
            raise


class _StaleToken(Exception):
    """A cached access token was refused before any work: get a fresh one."""


def _first(exc: BaseException, kind: type[E]) -> E | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _first(inner, kind)) is not None:
                return found
    return None
