"""RFC 9457 problem documents carrying the host contract's stable codes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, Final

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.openapi import ResponseSpec
from litestar.params import HeaderParameter

from libs.errors import RetryableError
from schemas.api import Problem
from schemas.base import ID_PATTERN
from services.ingress.console._i18n import Locale, negotiate, said, title_of

__all__ = [
    "STATUS",
    "ApiError",
    "EXCEPTION_HANDLERS",
    "IdempotencyKey",
    "LastEventId",
    "event_id",
    "locale_of",
    "problem",
    "problems",
]

log = logging.getLogger("writ.ingress.http")
PROBLEM_JSON: Final = "application/problem+json"
# The HTTP status of each stable code (docs/host-contract.md).
STATUS: Final = {
    "INVALID_REQUEST": 400,
    "UNAUTHENTICATED": 401,
    "UNKNOWN_TENANT": 401,
    "BAD_SIGNATURE": 401,
    "TOKEN_EXPIRED": 401,
    "INVALID_TOKEN": 401,
    "WRONG_TENANT": 403,
    "FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "CONFLICT": 409,
    "TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "TIMEOUT": 504,
    # Chat sessions (the planner's refusals): the session's state does not take it.
    "SESSION_BUSY": 409,
    "SESSION_PAUSED": 409,
    "SESSION_CLOSED": 409,
    "PLAN_ANSWERED": 409,
    "INVALID_TRANSITION": 409,
    "UNKNOWN_AGENT": 400,
}
_CODE_OF_STATUS: Final = {
    400: "INVALID_REQUEST",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    503: "UNAVAILABLE",
}
_ENCODER: Final = msgspec.json.Encoder()
IdempotencyKey = Annotated[
    str,
    HeaderParameter(
        name="Idempotency-Key",
        max_length=128,
        pattern=ID_PATTERN,
        description="The request id: the same key and body again returns the first answer; "
        "another body under it is 409 CONFLICT",
    ),
]


# An SSE stream's `id:` as a client sends it back: a header is text (RFC 9110), so its type is
# a string of digits, read as the number it is.
LastEventId = Annotated[
    str | None,
    HeaderParameter(
        name="Last-Event-ID",
        pattern=r"^-?[0-9]{1,18}$",
        required=False,
        description="The `id:` of the last event received: the stream resumes right after it",
    ),
]


def event_id(value: str | None, *, least: int) -> int | None:
    """A `Last-Event-ID` as its number (None when absent).

    Raises:
        ApiError: `INVALID_REQUEST` naming the header, below `least`.
    """
    if value is None:
        return None
    number = int(value)
    if number < least:
        raise ApiError("INVALID_REQUEST", f"header `Last-Event-ID`: Expected `int` >= {least}")
    return number


def problems(**described: str) -> dict[int, ResponseSpec]:
    """OpenAPI responses for problem documents, by status (`problems(s404="NOT_FOUND")`)."""
    # Every route may refuse what does not decode, and answer 503 while a service is away.
    described = {
        "s400": "INVALID_REQUEST: undecodable, an unknown field, a bound exceeded",
        "s503": "UNAVAILABLE: the service that answers this is away; retry",
        **described,
    }
    return {
        int(name[1:]): ResponseSpec(
            Problem, description=text, generate_examples=False, media_type=PROBLEM_JSON
        )
        for name, text in described.items()
    }


class ApiError(Exception):
    """A refusal with its stable code; the status follows from the code."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail[:1000]
        self.status = STATUS.get(code, 400)


def problem(
    code: str,
    detail: str,
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    locale: Locale = "en",
) -> Response[bytes]:
    """The problem+json response of a code, its `title` and `detail` in `locale` (the detail
    where it is a sentence Writ composes; free text, such as a validation error's, as it is).
    The `code` is the same in every language."""
    status = STATUS.get(code, 400)
    body = Problem(
        type="about:blank",
        title=title_of(code, locale),
        status=status,
        code=code,
        detail=said(None, detail[:1000], locale),
        instance=instance,
    )
    language = {"Content-Language": locale, "Vary": "Accept-Language"}
    if status == 503 and not any(k.lower() == "retry-after" for k in headers or {}):
        language["Retry-After"] = "1"  # unavailable for a moment: a client may try again
    return Response(
        _ENCODER.encode(body),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers={**(headers or {}), **language},
    )


def locale_of(request: Request[Any, Any, Any]) -> Locale:
    """The language a caller's `Accept-Language` asks for, of those Writ speaks (English
    unless it asks for French)."""
    return negotiate(None, request.headers.get("accept-language"))


def _api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    return problem(exc.code, exc.detail, instance=request.url.path, locale=locale_of(request))


def _validation(request: Request[Any, Any, Any], exc: ValidationException) -> Response[bytes]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    detail = "; ".join(_named(e) for e in extra) or exc.detail
    return problem("INVALID_REQUEST", detail, instance=request.url.path, locale=locale_of(request))


# Headers a route declares, by the name of their parameter.
_HEADERS: Final = {"idempotency_key": "Idempotency-Key", "last_event_id": "Last-Event-ID"}


def _named(error: Any) -> str:
    """One validation error, naming where it is as the NATS door does: a body field by its
    JSON path (msgspec's `... - at `$.budget``), a header or a parameter by its name."""
    if not isinstance(error, dict):
        return str(error)
    message, key = str(error.get("message", error)), error.get("key")
    source = str(error.get("source", ""))
    if not key or "`$." in message:
        return message
    if source == "body" or key == "data":
        return message if key == "data" else f"{message} - at `$.{key}`"
    if key in _HEADERS or source == "header":
        return f"header `{_HEADERS.get(key, key)}`: {message}"
    return f"`{key}`: {message}"


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    code = _CODE_OF_STATUS.get(
        exc.status_code, "INTERNAL" if exc.status_code >= 500 else "INVALID_REQUEST"
    )
    # A 405 names the methods the path takes (`Allow`, RFC 9110 §15.5.6).
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    return problem(
        code,
        exc.detail,
        instance=request.url.path,
        headers=headers or None,
        locale=locale_of(request),
    )


def _retryable(request: Request[Any, Any, Any], exc: RetryableError) -> Response[bytes]:
    return problem(
        "UNAVAILABLE",
        str(exc)[:300],
        instance=request.url.path,
        headers={"Retry-After": str(max(1, round(exc.delay or 1)))},
        locale=locale_of(request),
    )


def _internal(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return problem(
        "INTERNAL",
        "the request failed inside Writ",
        instance=request.url.path,
        locale=locale_of(request),
    )


EXCEPTION_HANDLERS: Final[
    dict[int | type[Exception], Callable[[Request[Any, Any, Any], Any], Response[Any]]]
] = {
    ApiError: _api_error,
    ValidationException: _validation,
    NotFoundException: _http,
    MethodNotAllowedException: _http,
    HTTPException: _http,
    RetryableError: _retryable,
    Exception: _internal,
}
