"""The connectors' HTTP client, and what a failed request means.

A connector must tell a request that never left from one that may have been applied. The first
(`NotSent`: no connection could be had, or not in time) is safe to send again; the second
(`NoAnswer`: a connection dropped or timed out once the request was on it, or the response was
cut short) only the system's own record can settle, by the same key replayed or by a lookup.

aiohttp, not httpx: on this project's bench machine a POST to the fake CRM cost the dispatcher
about 1.0-1.4 ms of CPU through httpx and 0.27-0.30 ms through aiohttp (2,000 requests each,
uvloop, the server in another process), the largest share of the dispatcher's CPU per run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

__all__ = ["HttpClient", "NoAnswer", "NotSent", "Response"]


class NotSent(Exception):
    """No connection was ever given the request: nothing can have been applied."""


class NoAnswer(Exception):
    """The request was (or may have been) sent and no whole response came back."""


class Response:
    """A response, read in full."""

    __slots__ = ("body", "status_code")

    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code, self.body = status_code, body

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: it is not JSON.
        """
        return json.loads(self.body)


class HttpClient:
    """One connector's connections to its system, with the credential it sends."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        timeout_s: float,
        connect_s: float = 2.0,
        keep_alive_s: float = 5.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        # `connect` covers waiting for a pooled connection and opening one; `sock_read` each
        # wait for the response once the request is sent.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_s, sock_read=timeout_s)
        self._keep_alive_s = keep_alive_s
        self._session: aiohttp.ClientSession | None = None

    def _opened(self) -> aiohttp.ClientSession:
        # Opened on first use, inside the event loop that will use it.
        if self._session is None:
            # At most 100 connections, and one idle for `keep_alive_s` is closed (httpx's
            # defaults: aiohttp's own 15 s kept a burst's connections open long after it).
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=self._keep_alive_s),
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Response:
        """Send one request (`json`, or `body`: JSON bytes sent as they are) and read its whole
        response.

        Raises:
            NotSent: no connection was given the request (refused, unreachable, timed out).
            NoAnswer: it may have been received; no whole response came back.
        """
        if body is not None:  # exact bytes (what an approval receipt's digest names), as JSON
            headers = {**(headers or {}), "Content-Type": "application/json"}
        try:
            async with self._opened().request(
                method,
                self._base_url + path,
                json=json,
                data=body,
                headers=headers,
                params=params,
            ) as response:
                return Response(response.status, await response.read())
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise NotSent(repr(exc)) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NoAnswer(repr(exc)) from exc

    async def aclose(self) -> None:
        """Close its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None
