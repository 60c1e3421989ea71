"""The SDK's errors: one class per kind of answer, each carrying the stable `code` Writ answered
with (docs/host-contract.md) and whether asking again may help (`retryable`).

Catch a kind (`NotFound`, `Conflict`, ...) or `WritError` for all; `error(code, ...)` builds the
right one for a code. A retry of a write under the same request id is safe for every code (it is
the same request); `retryable` says whether it is worth it.
"""

from __future__ import annotations

from typing import ClassVar, Final

__all__ = [
    "RETRYABLE_CODES",
    "AuthenticationError",
    "Conflict",
    "InvalidRequest",
    "InvalidResponse",
    "NotFound",
    "PermissionDenied",
    "Refused",
    "Timeout",
    "Unavailable",
    "WritError",
    "error",
]


class WritError(Exception):
    """Writ refused or could not answer; `code` is stable, `message` is for people."""

    retryable: ClassVar[bool] = False
    """Whether asking again (with the same request id) may get another answer."""

    def __init__(self, code: str, message: str = "", *, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code, self.message, self.status = code, message, status


class InvalidRequest(WritError, ValueError):
    """The request itself is wrong (a field, a size, an unknown agent): fix it, do not retry."""


class AuthenticationError(WritError):
    """The token (or the NATS login) was refused: unknown tenant, bad signature, expired,
    malformed or missing."""


class PermissionDenied(WritError, PermissionError):
    """The principal (a role, a tenant) or the connection (a NATS subject) may not do this."""


class NotFound(WritError, LookupError):
    """No such run, command, decision, proposal or session for this tenant (or not yet)."""


class Conflict(WritError):
    """The request id, key or state says otherwise: another body under the same request id,
    an answered decision, a busy or closed session."""


class Refused(WritError):
    """Writ decided no: governance denied it, a person rejected it, a budget is spent."""


class Unavailable(WritError, ConnectionError):
    """Writ (or the way to it) is down or overloaded: retry later under the same request id."""

    retryable = True


class Timeout(WritError, TimeoutError):
    """No answer in time; the request may still take effect: retry under the same request id."""

    retryable = True


class InvalidResponse(WritError):
    """What came back is not Writ's (too large, not decodable)."""


_KINDS: Final[dict[type[WritError], frozenset[str]]] = {
    InvalidRequest: frozenset(
        {
            "INVALID_REQUEST",
            "TOO_LARGE",
            "UNSUPPORTED_MEDIA_TYPE",
            "METHOD_NOT_ALLOWED",
            "INVALID_COMMAND",
            "INVALID_PROPOSAL",
            "INVALID_ANSWER",
            "INVALID_TRANSITION",
            "PROPOSAL_REQUIRED",
            "UNKNOWN_AGENT",
            "CAPABILITY_UNDESCRIBED",
        }
    ),
    AuthenticationError: frozenset(
        {"UNAUTHENTICATED", "UNKNOWN_TENANT", "BAD_SIGNATURE", "TOKEN_EXPIRED", "INVALID_TOKEN"}
    ),
    PermissionDenied: frozenset({"FORBIDDEN", "WRONG_TENANT", "PERMISSION_DENIED"}),
    NotFound: frozenset({"NOT_FOUND", "UNKNOWN_PENDING", "UNKNOWN_PROPOSAL", "UNKNOWN_REVIEW"}),
    Conflict: frozenset(
        {
            "CONFLICT",
            "ALREADY_ANSWERED",
            "REVISION_REQUIRED",
            "SESSION_BUSY",
            "SESSION_CLOSED",
            "SESSION_PAUSED",
            "PLAN_ANSWERED",
        }
    ),
    Refused: frozenset(
        {"DENIED", "REJECTED", "EXPIRED", "BUDGET_EXHAUSTED", "NO_BUDGET", "AGENT_UNAVAILABLE"}
    ),
    Unavailable: frozenset({"UNAVAILABLE", "INTERNAL", "NETWORK"}),
    Timeout: frozenset({"TIMEOUT"}),
    InvalidResponse: frozenset({"INVALID_RESPONSE"}),
}
_BY_CODE: Final = {code: kind for kind, codes in _KINDS.items() for code in codes}
_BY_STATUS: Final[dict[int, type[WritError]]] = {
    400: InvalidRequest,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    503: Unavailable,
    504: Timeout,
}

# Kept for callers that test codes: the codes whose errors are `retryable`.
RETRYABLE_CODES: Final = _KINDS[Unavailable] | _KINDS[Timeout]


def error(code: str, message: str = "", *, status: int | None = None) -> WritError:
    """The error for `code` (a code this SDK does not know: by HTTP `status`, else `WritError`)."""
    kind = _BY_CODE.get(code)
    if kind is None and status is not None:
        kind = _BY_STATUS.get(status, Unavailable if status >= 500 else None)
    return (kind or WritError)(code, message, status=status)
