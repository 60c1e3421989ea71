"""What the HTTP door refuses before any route reads a request, as the NATS door refuses it:
text PostgreSQL cannot store (U+0000, lone surrogates, bytes that are not UTF-8) in a path id, a
query parameter or anywhere in a body, JSON nested deeper than the bound, a body that is not
`application/json`; and the security headers every response carries, refusals included."""

from __future__ import annotations

from typing import Any, Final

from litestar import Request
from litestar.types import Message, Scope

from services.ingress.console import HEADERS as CONSOLE_HEADERS
from services.ingress.http._problems import ApiError
from services.ingress.logic import hostile_json, unstorable_parameter

__all__ = ["API_HEADERS", "check_body", "check_parameters", "secure_headers"]

# An API answer is data, never a page: nothing in it runs, frames or is cached.
API_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in headers.items()]


_API: Final = _encoded(API_HEADERS)
_CONSOLE: Final = _encoded(CONSOLE_HEADERS)


async def secure_headers(message: Message, scope: Scope) -> None:
    """Give every response the security headers it does not set itself: the console's on
    `/console`, the API's elsewhere (404s and 405s from routing included)."""
    if message["type"] != "http.response.start":
        return
    headers = list(message.get("headers") or [])
    present = {bytes(k).lower() for k, _ in headers}
    wanted = _CONSOLE if str(scope.get("path", "")).startswith("/console") else _API
    headers.extend((k, v) for k, v in wanted if k not in present)
    message["headers"] = headers


async def check_parameters(request: Request[Any, Any, Any]) -> None:
    """Refuse (400) a path id or query parameter that cannot be stored."""
    said = unstorable_parameter(request.path_params, request.query_params.multi_items())
    if said is not None:
        raise ApiError("INVALID_REQUEST", said)


async def check_body(request: Request[Any, Any, Any]) -> None:
    """Every `/api/v1` request: its parameters, then its body (415 unless JSON, 400 naming the
    field for what cannot be stored or nests too deep), before the route decodes it."""
    await check_parameters(request)
    if request.method not in _BODY_METHODS:
        return
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    body = await request.body()
    # Nothing sent where nothing is needed (no body, or an optional one) has no media type.
    if not body and (data is None or data.is_optional):
        return
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            "UNSUPPORTED_MEDIA_TYPE",
            f"a request body must be application/json, not {media[:64] or 'unlabelled'}",
        )
    said = hostile_json(body) if body else None
    if said is not None:
        raise ApiError("INVALID_REQUEST", said)
