"""The fake host's authorization server and its MCP server's protected-resource metadata, as
the MCP authorization spec describes them:

- `GET /.well-known/oauth-protected-resource/mcp` (RFC 9728, the path of `/mcp` inserted; and
  at the root): the resource `<base>/mcp` and its authorization server `<base>`. A 401 from
  `/mcp` names it in `WWW-Authenticate: Bearer resource_metadata="…"`. The same document is
  at a location no client would guess, `/oauth/metadata/mcp`: `/_control/metadata` can have the
  401 name that one (or any URL) and the well-known locations answer 404.
- `GET /.well-known/oauth-authorization-server` (RFC 8414): the issuer and its token endpoint.
- `POST /oauth/token`: the OAuth 2.0 client credentials grant (RFC 6749 §4.4;
  `client_secret_basic` or `_post`) with a resource indicator (RFC 8707): `resource` must be one
  the server serves (`<base>/mcp`, or `<base>/api/v1`), else `invalid_target`. Each access token
  is bound to that audience; `/mcp` takes only tokens whose audience is `<base>/mcp` (a token got
  for the REST API, or with no `resource`, is refused), beside the static MCP token.

The tokens and their audiences go in the host's state (`access_tokens`, `token_audiences`),
where its `/mcp` guard reads them.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["base_url", "resource_metadata_url", "token_routes"]

# The resources the authorization server issues tokens for, as paths under the host's base.
_RESOURCES = ("/mcp", "/api/v1")


def base_url(headers: dict[bytes, bytes] | Any, scheme: str = "http") -> str:
    """The host's base URL as the client addressed it (its Host header)."""
    host = headers.get(b"host", b"") if isinstance(headers, dict) else headers.get("host", "")
    return f"{scheme}://{host.decode() if isinstance(host, bytes) else host}"


def resource_metadata_url(base: str) -> str:
    """Where the `/mcp` resource's metadata is (RFC 9728 §3.1, path inserted)."""
    return f"{base}/.well-known/oauth-protected-resource/mcp"


def token_routes(state: Any, clients: dict[str, str]) -> list[Route]:
    """The metadata documents and `POST /oauth/token` for `clients` ({client id: secret})."""

    def refuse(status: int, error: str) -> JSONResponse:
        with state.lock:
            state.token_refusals += 1
        return JSONResponse(
            {"error": error}, status_code=status, headers={"Cache-Control": "no-store"}
        )

    async def protected_resource(request: Request) -> Response:
        base = base_url(request.headers)
        with state.lock:
            if request.url.path.startswith("/.well-known/") and not state.well_known_metadata:
                return JSONResponse({"error": "not_found"}, status_code=404)
            state.metadata_reads += 1
        return JSONResponse(
            {
                "resource": f"{base}/mcp",
                "authorization_servers": [base],
                "bearer_methods_supported": ["header"],
            }
        )

    async def authorization_server(request: Request) -> Response:
        base = base_url(request.headers)
        return JSONResponse(
            {
                "issuer": base,
                "token_endpoint": f"{base}/oauth/token",
                "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": [
                    "client_secret_basic",
                    "client_secret_post",
                ],
            }
        )

    async def token(request: Request) -> Response:
        raw = await request.body()
        if len(raw) > 4096:
            return refuse(400, "invalid_request")
        form = {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "basic":
            try:
                client_id, _, secret = base64.b64decode(value).decode().partition(":")
            except ValueError:
                return refuse(401, "invalid_client")
        expected = clients.get(client_id)
        if expected is None or not hmac.compare_digest(secret.encode(), expected.encode()):
            return refuse(401, "invalid_client")
        if form.get("grant_type") != "client_credentials":
            return refuse(400, "unsupported_grant_type")
        base = base_url(request.headers)
        resource = form.get("resource")
        if resource is not None and resource not in {f"{base}{p}" for p in _RESOURCES}:
            return refuse(400, "invalid_target")
        issued = secrets.token_urlsafe(24)
        with state.lock:
            state.access_tokens[issued] = time.time() + 3600
            state.token_audiences[issued] = resource or ""
            state.tokens_issued += 1
            state.token_resources.append(resource or "")
        return JSONResponse(
            {"access_token": issued, "token_type": "Bearer", "expires_in": 3600},
            headers={"Cache-Control": "no-store"},
        )

    return [
        Route("/.well-known/oauth-protected-resource/mcp", protected_resource, methods=["GET"]),
        Route("/.well-known/oauth-protected-resource", protected_resource, methods=["GET"]),
        Route("/oauth/metadata/mcp", protected_resource, methods=["GET"]),
        Route("/.well-known/oauth-authorization-server", authorization_server, methods=["GET"]),
        Route("/oauth/token", token, methods=["POST"]),
    ]
