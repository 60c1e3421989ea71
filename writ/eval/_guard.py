"""The evaluation's only way out: an HTTP transport that lets through requests to the origins it
was given (the candidate's base URL, loopback fakes a test names) and refuses every other one
before a connection is opened. The evaluation builds its providers' clients on it; it builds
no bus connection, no database connection in `run`, and holds no connector credential."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx

from libs.errors import PermanentError

__all__ = ["AllowList", "EgressRefused", "origin"]


class EgressRefused(PermanentError):
    """A request to an origin the evaluation was not given: never sent."""

    def __init__(self, url: str) -> None:
        super().__init__(f"the evaluation may not reach {url}: only the candidate's base URL")
        self.url = url


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL, the port made explicit."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname.lower(), port


class AllowList(httpx.AsyncBaseTransport):
    """An httpx transport that sends only to the allowed origins."""

    def __init__(
        self, allowed: Iterable[str], *, inner: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.allowed = frozenset(origin(u) for u in allowed)
        self.refused: list[str] = []
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if origin(url) not in self.allowed:
            self.refused.append(url)
            raise EgressRefused(url)
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
