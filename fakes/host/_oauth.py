"""The fake host's authorization server: a token endpoint for the OAuth 2.0 client credentials
grant (RFC 6749 §4.4), `client_secret_basic` or `client_secret_post`. The access tokens it issues
go in the host's state (`access_tokens`), where its `/mcp` guard takes them."""

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

__all__ = ["token_routes"]


def token_routes(state: Any, clients: dict[str, str]) -> list[Route]:
    """`POST /oauth/token` for `clients` ({client id: secret}); `state` is the host's."""

    def refuse(status: int, error: str) -> JSONResponse:
        with state.lock:
            state.token_refusals += 1
        return JSONResponse(
            {"error": error}, status_code=status, headers={"Cache-Control": "no-store"}
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
        issued = secrets.token_urlsafe(24)
        with state.lock:
            state.access_tokens[issued] = time.time() + 3600
            state.tokens_issued += 1
        return JSONResponse(
            {"access_token": issued, "token_type": "Bearer", "expires_in": 3600},
            headers={"Cache-Control": "no-store"},
        )

    return [Route("/oauth/token", token, methods=["POST"])]
