"""Access tokens for `client_credentials` registrations, as the MCP authorization spec asks:

- the protected resource is the registration's URL; its metadata (RFC 9728) is where the
  server's 401 says (`WWW-Authenticate: Bearer resource_metadata="…"`, §5.1), asked for once
  without a token, or else at `/.well-known/oauth-protected-resource` with the URL's path
  inserted (then at the root); it must name that very resource — metadata naming another one is
  refused;
- its authorization server's metadata (RFC 8414, `/.well-known/oauth-authorization-server`,
  the issuer's path inserted) gives the token endpoint, and must name the issuer it was found
  for; a registration that names its `token_url` skips both;
- what the server names is followed only on its own origin or one the registration names
  (`auth_origins`): the metadata URL its 401 gives, the authorization server, the token
  endpoint. Anything else is refused before it is asked, so a server can neither point
  retrieval at another host nor have Writ's client secret sent where the operator did not say;
- the token request is the client credentials grant (RFC 6749 §4.4, `client_secret_basic`)
  with the `resource` parameter (RFC 8707), so the token is bound to this server's audience and
  a server that checks it refuses tokens got for another;
- tokens are kept per token endpoint, client and resource until shortly before they expire (at
  most an hour, a minute less than said); a cached one the server refuses is dropped with the
  endpoint discovered for it, and one fresh token is got where the server's 401 says now (the
  client's `_StaleToken`).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import Annotated, Final
from urllib.parse import urlsplit

import anyio
import httpx2
import msgspec

from services.retrieval.mcp.servers import ClientCredentials, ServerConfig

__all__ = ["McpTokenError", "Tokens", "named_metadata", "origin", "well_known"]

_MAX_ANSWER: Final = 16 * 1024
_MAX_CHALLENGE: Final = 4096
# `resource_metadata` as an auth-param of a challenge (RFC 9110 §11.2): a quoted string (with
# backslash escapes) or a token.
_RESOURCE_METADATA: Final = re.compile(
    r'(?:^|[\s,])resource_metadata\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]+))', re.IGNORECASE
)
_URL: Final = re.compile(r"https?://[^\s]{1,2000}")


class McpTokenError(Exception):
    """Base of the errors this module raises; the client maps them to its own."""

    def __init__(self, message: str, *, refused: bool) -> None:
        super().__init__(message)
        self.refused = refused  # True: an operator must act; False: transient


class _TokenAnswer(msgspec.Struct, kw_only=True):
    """A token endpoint's answer (RFC 6749 §5.1; other members are ignored, as it says)."""

    access_token: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
    token_type: Annotated[str, msgspec.Meta(max_length=64)]
    expires_in: Annotated[int, msgspec.Meta(ge=0)] | None = None


class _TokenError(msgspec.Struct, kw_only=True):
    error: Annotated[str, msgspec.Meta(max_length=64)] = "unknown"


class _ResourceMetadata(msgspec.Struct, kw_only=True):
    """RFC 9728 §2 (the members Writ uses)."""

    resource: Annotated[str, msgspec.Meta(max_length=2000)]
    authorization_servers: Annotated[list[str], msgspec.Meta(min_length=1, max_length=8)]


class _ServerMetadata(msgspec.Struct, kw_only=True):
    """RFC 8414 §2 (the members Writ uses)."""

    issuer: Annotated[str, msgspec.Meta(max_length=2000)]
    token_endpoint: Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]{1,2000}$")]


def well_known(url: str, name: str) -> list[str]:
    """Where a metadata document of `url` may be: the path inserted, then the root."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    return [f"{origin}/.well-known/{name}{path}", f"{origin}/.well-known/{name}"][
        0 if path else 1 :
    ]


def named_metadata(challenge: str) -> str | None:
    """The `resource_metadata` URL a `WWW-Authenticate` header names (RFC 9728 §5.1), if any;
    a header over 4 KiB, or a value that is not an absolute http(s) URL, names none."""
    if len(challenge) > _MAX_CHALLENGE:
        return None
    match = _RESOURCE_METADATA.search(challenge)
    if match is None:
        return None
    value = match[1] if match[1] is not None else match[2]
    value = re.sub(r"\\(.)", r"\1", value)
    return value if _URL.fullmatch(value) else None


def origin(url: str) -> str | None:
    """`scheme://host:port` of an absolute http(s) URL (the port always written), or None for
    one that is not that or carries a user."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    if port is None:
        port = 443 if parts.scheme.lower() == "https" else 80
    host = parts.hostname.lower()
    return f"{parts.scheme.lower()}://{f'[{host}]' if ':' in host else host}:{port}"


def _followed(url: str, server: ServerConfig, what: str) -> str:
    """`url`, if it is on the server's own origin or one the registration names; else refused."""
    allowed = {origin(server.url), *(origin(o) for o in server.auth_origins)} - {None}
    at = origin(url)
    if at is None or at not in allowed:
        raise McpTokenError(
            f"{what} is at {url[:300]!r}, not on the server's origin nor one the registration "
            "names: refused (name its origin with --auth-origin if it is the host's)",
            refused=True,
        )
    if urlsplit(server.url).scheme.lower() == "https" and at.startswith("http:"):
        raise McpTokenError(f"{what} is at {url[:300]!r}, over plain http: refused", refused=True)
    return url


class Tokens:
    """The access tokens of `client_credentials` registrations (see the module's docstring)."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str, str, str], tuple[str, float]] = {}
        # (resource, the origins it may use) -> token endpoint, once discovered
        self._endpoints: dict[tuple[str, tuple[str, ...]], str] = {}

    def _key(self, server: ServerConfig, creds: ClientCredentials) -> tuple[str, str, str, str]:
        digest = hashlib.sha256(creds.client_secret.encode()).hexdigest()
        return creds.token_url or "", creds.client_id, digest, server.url

    def forget(self, server: ServerConfig) -> None:
        """Drop the cached token of `server` (the server refused it), and the token endpoint
        discovered for it: the next token is got where the server's 401 says now (RFC 9728
        §5.1), its metadata and authorization server read again under the same origin rules."""
        self._endpoints.pop((server.url, tuple(server.auth_origins)), None)
        try:
            creds = server.client_credentials()
        except ValueError:
            return
        self._held.pop(self._key(server, creds), None)

    async def get(self, server: ServerConfig) -> tuple[str, bool]:
        """A bearer for `server` and whether it came from the cache.

        Raises:
            McpTokenError: the credentials, the metadata or the token endpoint refused
                (`refused`), or something did not answer (transient).
        """
        try:
            creds = server.client_credentials()
        except ValueError as exc:
            raise McpTokenError(str(exc), refused=True) from exc
        key = self._key(server, creds)
        held = self._held.get(key)
        if held is not None and time.monotonic() < held[1]:
            return held[0], True
        timeout = httpx2.Timeout(server.timeout_s, connect=min(server.timeout_s, 3.0))
        # The whole exchange, discovery included, is bounded as a session is: a server that
        # answers a byte at a time never holds the read longer.
        with anyio.move_on_after(server.timeout_s * 3) as bounded:
            async with httpx2.AsyncClient(timeout=timeout) as http:
                endpoint = creds.token_url or await self._discover(http, server)
                form = {"grant_type": "client_credentials", "resource": server.url}
                if creds.scope:
                    form["scope"] = creds.scope
                status, body = await _fetch(
                    http,
                    "POST",
                    endpoint,
                    "the token endpoint",
                    data=form,
                    auth=(creds.client_id, creds.client_secret),
                )
        if bounded.cancelled_caught:
            raise McpTokenError(
                f"getting an access token took over {server.timeout_s * 3:g} s", refused=False
            )
        if status in (400, 401, 403):
            try:
                error = msgspec.json.decode(body, type=_TokenError).error
            except msgspec.DecodeError:
                error = "unknown"
            raise McpTokenError(
                f"the token endpoint refused Writ's client credentials (HTTP {status}: {error})",
                refused=True,
            )
        if status != 200:
            raise McpTokenError(f"the token endpoint did not answer (HTTP {status})", refused=False)
        try:
            answer = msgspec.json.decode(body, type=_TokenAnswer)
        except msgspec.DecodeError as exc:
            raise McpTokenError(
                f"the token endpoint answered badly: {exc}"[:200], refused=False
            ) from exc
        if answer.token_type.lower() != "bearer":
            raise McpTokenError(
                f"the token endpoint issued a {answer.token_type[:20]} token, not a bearer one",
                refused=False,
            )
        life = min(answer.expires_in if answer.expires_in is not None else 3600, 3600)
        self._held[key] = (answer.access_token, time.monotonic() + max(life - 60, 0))
        return answer.access_token, False

    async def _discover(self, http: httpx2.AsyncClient, server: ServerConfig) -> str:
        """The token endpoint of the server's authorization server, from the metadata."""
        resource = server.url
        key = (resource, tuple(server.auth_origins))
        if key in self._endpoints:
            return self._endpoints[key]
        named = await _challenge(http, resource)
        if named is not None:
            urls = [
                _followed(named, server, "the protected-resource metadata the server's 401 names")
            ]
        else:
            urls = well_known(resource, "oauth-protected-resource")
        prm = await _document(http, urls, "")
        try:
            found = msgspec.json.decode(prm, type=_ResourceMetadata)
        except msgspec.DecodeError as exc:
            raise McpTokenError(
                f"the protected-resource metadata is not valid: {exc}"[:200], refused=True
            ) from exc
        if found.resource.rstrip("/") != resource.rstrip("/"):
            # RFC 9728 §3.3: metadata for another resource is not this server's.
            raise McpTokenError(
                f"the protected-resource metadata names {found.resource[:200]!r}, not "
                f"{resource[:200]!r}: refused",
                refused=True,
            )
        issuer = _followed(
            found.authorization_servers[0], server, "the authorization server the metadata names"
        )
        asm = await _document(http, well_known(issuer, "oauth-authorization-server"), issuer)
        try:
            found_as = msgspec.json.decode(asm, type=_ServerMetadata)
        except msgspec.DecodeError as exc:
            raise McpTokenError(
                f"the authorization-server metadata is not valid: {exc}"[:200], refused=True
            ) from exc
        if found_as.issuer.rstrip("/") != issuer.rstrip("/"):
            raise McpTokenError(
                f"the authorization-server metadata names the issuer {found_as.issuer[:200]!r}, "
                f"not {issuer[:200]!r}: refused",
                refused=True,
            )
        endpoint = _followed(found_as.token_endpoint, server, "the token endpoint")
        self._endpoints[key] = endpoint
        return endpoint


async def _challenge(http: httpx2.AsyncClient, resource: str) -> str | None:
    """The metadata URL the server's 401 names when asked without a token (RFC 9728 §5.1),
    or None (no 401, or no `resource_metadata` in it: the well-known locations then). Only
    the headers are read."""
    try:
        async with http.stream(
            "GET", resource, headers={"Accept": "application/json, text/event-stream"}
        ) as response:
            status = response.status_code
            challenge = response.headers.get("www-authenticate", "")
    except httpx2.HTTPError as exc:
        raise McpTokenError(
            f"the MCP server did not answer ({type(exc).__name__})", refused=False
        ) from exc
    return named_metadata(challenge) if status == 401 else None


async def _document(http: httpx2.AsyncClient, urls: list[str], issuer: str) -> bytes:
    """The first of `urls` that answers 200 (a metadata document)."""
    last = 0
    for url in urls:
        status, body = await _fetch(http, "GET", url, "the authorization metadata")
        if status == 200:
            return body
        last = status
    what = "authorization-server" if issuer else "protected-resource"
    raise McpTokenError(
        f"no {what} metadata at {urls[0][:300]} (HTTP {last}): register the token URL instead",
        refused=True,
    )


async def _fetch(
    http: httpx2.AsyncClient, method: str, url: str, what: str, **kwargs: object
) -> tuple[int, bytes]:
    """The status and body of one request; the body is read only up to 16 KiB, so an answer
    that never ends (or is merely huge) is refused once that much has come."""
    body = bytearray()
    try:
        async with http.stream(
            method,
            url,
            headers={"Accept": "application/json"},
            **kwargs,  # type: ignore[arg-type]
        ) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > _MAX_ANSWER:
                    raise McpTokenError(f"{what}'s answer is over 16 KiB", refused=False)
            return response.status_code, bytes(body)
    except httpx2.HTTPError as exc:
        raise McpTokenError(f"{what} did not answer ({type(exc).__name__})", refused=False) from exc
