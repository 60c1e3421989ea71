"""The console's only way to Writ: the HTTP API (`/api/v1`) of its own ingress, over loopback,
with the viewer's token. It sees what the API shows that token and can do what the API lets
it: nothing of another tenant, no approval of anything but a proposal id."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx

from services.ingress.console._i18n import current, said
from services.ingress.console._session import Viewer
from services.ingress.logic import console_proof

__all__ = ["ApiClient", "ApiAnswer"]


class ApiAnswer:
    """One API answer: its status and decoded JSON body."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300

    @property
    def problem(self) -> str:
        """A refusal as a person reads it (`CODE: detail`, the detail in the page's language
        where the catalog has it: the API answered in it, or it is a code's meaning)."""
        if isinstance(self.body, dict):
            code = self.body.get("code")
            why = said(str(code) if code else None, self.body.get("detail") or "")
            return f"{code or self.status}: {why}"
        return f"HTTP {self.status}"


class ApiClient:
    """`/api/v1` as the viewer."""

    def __init__(self, base_url: str, *, timeout_s: float = 40.0, console_key: bytes = b"") -> None:
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self._key = console_key

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    def _auth(self, viewer: Viewer) -> dict[str, str]:
        # The API speaks the page's language in what it composes (its problems' texts).
        headers = {"Authorization": f"Bearer {viewer.token}", "Accept-Language": current()}
        if viewer.signed_in:
            # A session's sign-in token: the API takes it only with this process's proof.
            headers["Writ-Console-Proof"] = console_proof(self._key, viewer.token)
        return headers

    async def get(self, viewer: Viewer, path: str, **params: Any) -> ApiAnswer:
        """A read."""
        response = await self._http.get(
            path,
            headers=self._auth(viewer),
            params={k: v for k, v in params.items() if v is not None},
        )
        return ApiAnswer(response.status_code, _json(response))

    async def post(
        self, viewer: Viewer, path: str, body: dict[str, Any] | None, *, key: str | None = None
    ) -> ApiAnswer:
        """A write. `key` names the person's one intent (the Idempotency-Key): a second click,
        a second tab or a reload of the same answer gets the first answer back."""
        headers = self._auth(viewer)
        if key is not None:
            digest = hashlib.sha256(f"{viewer.principal}\x00{key}".encode()).hexdigest()[:48]
            headers["Idempotency-Key"] = f"console-{digest}"
        response = await self._http.post(path, headers=headers, json=body)
        return ApiAnswer(response.status_code, _json(response))

    def stream(self, viewer: Viewer, path: str) -> Any:
        """A Server-Sent Events stream, as the viewer (`async with`)."""
        return self._http.stream(
            "GET",
            path,
            headers={**self._auth(viewer), "Accept": "text/event-stream"},
            timeout=httpx.Timeout(10.0, read=None),
        )


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
