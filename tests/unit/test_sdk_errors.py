"""The SDK's errors: one class per kind of answer, found by Writ's stable code (or the HTTP
status for a code it does not know), each saying whether a retry may help."""

from __future__ import annotations

import pytest

from writ_client.errors import (
    AuthenticationError,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Refused,
    Timeout,
    Unavailable,
    WritError,
    error,
)


@pytest.mark.parametrize(
    ("code", "status", "kind", "builtin", "retryable"),
    [
        ("INVALID_REQUEST", 400, InvalidRequest, ValueError, False),
        ("TOO_LARGE", 413, InvalidRequest, ValueError, False),
        ("BAD_SIGNATURE", None, AuthenticationError, Exception, False),
        ("FORBIDDEN", 403, PermissionDenied, PermissionError, False),
        ("PERMISSION_DENIED", None, PermissionDenied, PermissionError, False),
        ("NOT_FOUND", 404, NotFound, LookupError, False),
        ("CONFLICT", 409, Conflict, Exception, False),
        ("SESSION_BUSY", 409, Conflict, Exception, False),
        ("DENIED", None, Refused, Exception, False),
        ("UNAVAILABLE", 503, Unavailable, ConnectionError, True),
        ("NETWORK", None, Unavailable, ConnectionError, True),
        ("TIMEOUT", 504, Timeout, TimeoutError, True),
    ],
)
def test_each_code_is_its_kind(
    code: str, status: int | None, kind: type[WritError], builtin: type, retryable: bool
) -> None:
    err = error(code, "detail", status=status)
    assert type(err) is kind and isinstance(err, builtin) and isinstance(err, WritError)
    assert (err.code, err.message, err.status, err.retryable) == (code, "detail", status, retryable)
    assert str(err) == f"{code}: detail"


def test_an_unknown_code_falls_back_on_its_status() -> None:
    assert type(error("SOMETHING_NEW", status=404)) is NotFound
    assert type(error("SOMETHING_NEW", status=502)) is Unavailable
    unknown = error("SOMETHING_NEW")
    assert type(unknown) is WritError and not unknown.retryable
