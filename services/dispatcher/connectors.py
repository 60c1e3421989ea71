"""Connectors: the only code in Writ that acts on business systems, with their credentials.

Each connector declares what its provider can prove after a lost response (DESIGN.md §5):
`idempotent` (the same key replays safely), `queryable` (the key can be looked up) or `none`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import httpx
import msgspec

__all__ = ["Connector", "CrmConnector", "Result"]

Contract = Literal["idempotent", "queryable", "none"]


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What a call established.

    `succeeded` / `rejected` / `revision_mismatch` are known; `transient` means the request
    certainly had no effect (refused before or without acting); `lost` means it may have had one.
    """

    kind: Literal["succeeded", "rejected", "revision_mismatch", "transient", "lost"]
    receipt: str | None = None
    detail: str = ""


class Connector(Protocol):
    """One business system."""

    name: str
    contract: Contract

    async def execute(self, action: str, arguments: dict[str, Any], *, key: str,
                      expected_revision: str | None) -> Result: ...

    async def aclose(self) -> None: ...


class CrmConnector:
    """The CRM's HTTP API; it honours `Idempotency-Key`, so replaying a key is safe."""

    name = "crm"
    contract: Contract = "idempotent"

    def __init__(self, *, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=2.0),
            headers={"Authorization": f"Bearer {token}"},
        )

    async def execute(self, action: str, arguments: dict[str, Any], *, key: str,
                      expected_revision: str | None) -> Result:
        """Perform `action` with `key` as the provider's idempotency key."""
        if action != "crm.note.create":
            return Result(kind="rejected", detail=f"crm cannot perform {action}")
        headers = {"Idempotency-Key": key}
        if expected_revision is not None:
            headers["If-Match"] = expected_revision
        try:
            response = await self._client.post(
                f"/v1/customers/{arguments['customer_id']}/notes",
                json={"body": arguments["body"]}, headers=headers)
        except httpx.ConnectError as exc:
            return Result(kind="transient", detail=f"connect failed: {exc!r}"[:500])
        except httpx.TransportError as exc:
            # The request may have been received and applied: only the key can tell.
            return Result(kind="lost", detail=f"no response: {exc!r}"[:500])
        if response.status_code in (200, 201):
            return Result(kind="succeeded", receipt=str(response.json()["note_id"]))
        if response.status_code == 412:
            return Result(kind="revision_mismatch", detail=response.text[:500])
        if response.status_code in (429, 502, 503, 504):
            return Result(kind="transient", detail=f"HTTP {response.status_code}")
        return Result(kind="rejected", detail=f"HTTP {response.status_code}: {response.text}"[:500])

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
