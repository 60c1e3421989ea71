"""What the console's pages share: its response headers, the forms a browser may post (closed
and bounded like any API body), and a refusal rendered as a page."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from litestar import Response
from litestar.datastructures import Cookie

__all__ = [
    "CSP",
    "HEADERS",
    "ApproveForm",
    "Bad",
    "DecideForm",
    "Form",
    "RejectForm",
    "ReviewForm",
    "html_page",
]

# No inline script or style, nothing from elsewhere, no framing, forms only to the console.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


# What a person's browser may post: each form is closed and bounded like any API body.
class Form(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    csrf: Annotated[str, msgspec.Meta(max_length=128)]


class ApproveForm(Form, frozen=True):
    grant: Literal["once", "always"] = "once"


class RejectForm(Form, frozen=True):
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


class DecideForm(Form, frozen=True):
    answer: Literal["once", "always", "deny"]
    reason: Annotated[str, msgspec.Meta(max_length=500)] = ""


class ReviewForm(Form, frozen=True):
    answer: Literal["approve", "reject"]
    comment: Annotated[str, msgspec.Meta(max_length=500)] = ""


class Bad(Exception):
    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.title, self.text = status, title, text


def html_page(
    body: str,
    status: int = 200,
    *,
    cookies: list[Cookie] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[str]:
    return Response(
        body,
        status_code=status,
        media_type="text/html; charset=utf-8",
        headers={**HEADERS, **(headers or {})},
        cookies=cookies or [],
    )
