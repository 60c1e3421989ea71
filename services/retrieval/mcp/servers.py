"""The operator's registration of MCP servers, per tenant (`writ mcp add`).

A JSON file (`WRIT_MCP_SERVERS_FILE`; on Kubernetes a Secret or ConfigMap): `{"<tenant>":
{"<server>": {"url", "credential_file", "tools": [...], "facts": {"host_ticket": "<tool>"},
"transport"}}}`. `transport` is `auto` (Streamable HTTP, falling back to the legacy HTTP+SSE
transport when the server answers the first POST with a 4xx other than 401/403, as the spec's
backwards-compatibility section says), `streamable_http` or `sse` (legacy only).
`tools` are the tools Writ exposes as capabilities (anything else the server lists is never
called); `facts` names the tool admission's previews read a host record with. Only retrieval is
given this file and the credential files it names. It is re-read when it changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from libs.settings import read_secret
from schemas.mcp import McpToolName, ServerName

__all__ = ["ServerConfig", "ServerRegistry"]

log = logging.getLogger("writ.retrieval")


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One registered server of one tenant."""

    url: Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]{1,2000}$")]
    credential_file: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    tools: Annotated[list[McpToolName], msgspec.Meta(max_length=64)] = []
    facts: dict[str, McpToolName] = {}
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 10.0
    transport: Literal["auto", "streamable_http", "sse"] = "auto"

    def credential(self) -> str:
        """The bearer token, read from its secret file now (a rotated file is picked up)."""
        return read_secret(self.credential_file)


_File = dict[str, dict[ServerName, ServerConfig]]


class ServerRegistry:
    """The registrations, re-read from their file when its modification time changes."""

    def __init__(self, path: str | Path | None) -> None:
        self._path = Path(path) if path else None
        self._seen: tuple[int, int] | None = None
        self._servers: _File = {}

    def get(self, tenant: str, server: str) -> ServerConfig | None:
        """The tenant's registration of `server`, or None."""
        self._refresh()
        return self._servers.get(tenant, {}).get(server)

    def names(self, tenant: str) -> list[str]:
        """The servers registered for `tenant`, by name."""
        self._refresh()
        return sorted(self._servers.get(tenant, {}))

    def _refresh(self) -> None:
        if self._path is None:
            return
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            self._servers, self._seen = {}, None
            return
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        try:
            self._servers = msgspec.json.decode(self._path.read_bytes(), type=_File)
        except (OSError, msgspec.DecodeError) as exc:
            # A broken file registers nothing: no server is called on a guess.
            log.warning("MCP servers file %s refused: %s", self._path, exc)
            self._servers = {}
        self._seen = seen
