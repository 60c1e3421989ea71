"""The operator's registration of MCP servers, per tenant (`writ mcp add`).

A JSON file (`WRIT_MCP_SERVERS_FILE`; on Kubernetes a Secret or ConfigMap): `{"<tenant>":
{"<server>": {"url", "credential_file", "tools": [...], "facts": {"host_ticket": "<tool>"},
"transport"}}}`. `transport` is `auto` (Streamable HTTP, falling back to the legacy HTTP+SSE
transport when the server answers the first POST with a 4xx other than 401/403, as the spec's
backwards-compatibility section says), `streamable_http`, `sse` (legacy only) or `stdio`: a
local server retrieval runs as its own child process (`command`, an argv), for trusted local
servers only, with no environment but the one the registration names (`env`, and `env_files`
whose values are secret files). `auth` is
`bearer` (the credential file holds the token) or `client_credentials` (it holds
`{"client_id", "client_secret", "token_url", "scope"?}`: the OAuth 2.0 client credentials grant,
RFC 6749 §4.4, and the token it gets is the bearer; `auth_origins` names the origins besides
the server's own its authorization metadata and server may be at).
`tools` are the tools Writ exposes as capabilities (anything else the server lists is never
called); `resources` names resources Writ exposes, `{"<name>": "<uri>"}`, read as
`mcp:<server>/<name>` under the same governance; `facts` names the tool admission's previews
read a host record with. Only retrieval is given this file and the credential files it names.
It is re-read when it changes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from libs.errors import ConfigError
from libs.settings import read_secret
from schemas.mcp import McpToolName, ServerName

__all__ = ["ClientCredentials", "ServerConfig", "ServerRegistry"]

log = logging.getLogger("writ.retrieval")


class ClientCredentials(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a `client_credentials` registration's secret file holds."""

    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    client_secret: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    # None: discovered from the server's protected-resource metadata (RFC 9728, RFC 8414).
    token_url: Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]{1,2000}$")] | None = None
    scope: Annotated[str, msgspec.Meta(max_length=1000)] | None = None


_EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
# An origin, scheme://host[:port], with no path, user or query.
_Origin = Annotated[str, msgspec.Meta(pattern=r"^https?://[A-Za-z0-9.\-\[\]:]{1,255}(?!\n)$")]


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One registered server of one tenant: a remote one (`url`, `credential_file`), or a
    local one run over stdio (`command`, with exactly the environment `env` and `env_files`
    name)."""

    url: Annotated[str, msgspec.Meta(pattern=r"^(https?://[^\s]{1,2000})?$")] = ""
    credential_file: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    tools: Annotated[list[McpToolName], msgspec.Meta(max_length=64)] = []
    # Resources Writ exposes, each under a name of the tool kind: `mcp:<server>/<name>` reads
    # the resource at that URI (`resources/read`), governed like a tool.
    resources: Annotated[
        dict[McpToolName, Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]],
        msgspec.Meta(max_length=64),
    ] = {}
    facts: dict[str, McpToolName] = {}
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 10.0
    transport: Literal["auto", "streamable_http", "sse", "stdio"] = "auto"
    auth: Literal["bearer", "client_credentials"] = "bearer"
    command: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]],
        msgspec.Meta(max_length=64),
    ] = []
    env: Annotated[
        dict[_EnvName, Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=64)
    ] = {}
    # Variables whose value is a secret file's content (read at each start of the server).
    env_files: Annotated[dict[_EnvName, str], msgspec.Meta(max_length=16)] = {}
    # Origins besides the server's own that client-credentials discovery may use: where the
    # protected-resource metadata a 401 names may be, and the authorization server Writ sends
    # its client secret to. Anything the server names elsewhere is refused.
    auth_origins: Annotated[list[_Origin], msgspec.Meta(max_length=8)] = []

    def __post_init__(self) -> None:
        if both := sorted(set(self.tools) & set(self.resources)):
            raise ValueError(f"{', '.join(both)}: a name is a tool's or a resource's, not both")
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("a stdio server needs its command (--command)")
            if self.url or self.credential_file:
                raise ValueError(
                    "a stdio server has no url or credential file: what it needs goes in "
                    "its environment (env, env_files)"
                )
        else:
            if not self.url:
                raise ValueError(
                    "a remote server needs an http(s) url; a local server is registered "
                    "with transport stdio and its command"
                )
            if not self.credential_file:
                raise ValueError("a remote server needs a credential file")
            if self.command or self.env or self.env_files:
                raise ValueError("command, env and env_files are for stdio servers only")
        if self.auth_origins and self.auth != "client_credentials":
            raise ValueError(
                "auth_origins are for client_credentials registrations (--auth "
                "client_credentials): a static bearer discovers nothing"
            )

    def environment(self) -> dict[str, str]:
        """The stdio server's whole environment: `env`, and `env_files` read now.

        Raises:
            ValueError: a secret file cannot be read (the message names the file, not the
                secret).
        """
        values = dict(self.env)
        for name, path in self.env_files.items():
            try:
                values[name] = read_secret(path)
            except ConfigError as exc:
                raise ValueError(str(exc)) from exc
        return values

    def credential(self) -> str:
        """The bearer token, read from its secret file now (a rotated file is picked up)."""
        return read_secret(self.credential_file)

    def client_credentials(self) -> ClientCredentials:
        """The client id, secret and token URL, read from the secret file now.

        Raises:
            ValueError: the file cannot be read or is not exactly that (its reason says which
                field, never the secret).
        """
        try:
            return msgspec.json.decode(read_secret(self.credential_file), type=ClientCredentials)
        except (ConfigError, msgspec.DecodeError) as exc:
            raise ValueError(
                f"{self.credential_file} is not client credentials: {str(exc)[:200]}"
            ) from exc


_File = dict[str, dict[ServerName, ServerConfig]]


class ServerRegistry:
    """The registrations, re-read from their file when its modification time changes."""

    def __init__(self, path: str | Path | None) -> None:
        self._path = Path(path) if path else None
        self._seen: tuple[int, int] | None = None
        self._servers: _File = {}
        self._refused = False

    def get(self, tenant: str, server: str) -> ServerConfig | None:
        """The tenant's registration of `server`, or None."""
        self._refresh()
        return self._servers.get(tenant, {}).get(server)

    def refusal(self) -> str:
        """Why no server is registered, if the file is refused ('' otherwise), in words fit
        for any tenant (the file's own error, which may name other tenants' servers, is in
        retrieval's log)."""
        self._refresh()
        if not self._refused:
            return ""
        return (
            "the registration file is refused, so no server is (retrieval's log says why: an "
            "operator mends the file, or removes it and registers the servers again with "
            "writ mcp add)"
        )

    def unregistered(self, tenant: str, server: str) -> str:
        """Why `server` is not registered for `tenant` (see `refusal`)."""
        said = f"no MCP server {server} is registered for {tenant}"
        refusal = self.refusal()
        return f"{said}: {refusal}" if refusal else said

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
            self._servers, self._seen, self._refused = {}, None, False
            return
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        try:
            self._servers = msgspec.json.decode(self._path.read_bytes(), type=_File)
            self._refused = False
        except (OSError, msgspec.DecodeError) as exc:
            # A broken file registers nothing: no server is called on a guess.
            log.warning("MCP servers file %s refused: %s", self._path, exc)
            self._servers, self._refused = {}, True
        self._seen = seen
