"""The host connector: writes to the host product over its own REST API (docs/design.md §11).

The host stays the system of record: Writ reads it through its MCP server (retrieval) and writes
back here, never through MCP. The host honours `Idempotency-Key` (same key, same body: the first
answer again; same key, another body: 422), so the connector is `idempotent`: a lost response is
replayed with the same key, `<tenant>:<operation_id>`, and makes one comment. `If-Match` carries
the revision the preview showed; a 412 means the record moved on (`revision_required`).
"""

from __future__ import annotations

from typing import Any

from services.dispatcher.connectors.base import (
    Contract,
    Result,
    answer_of,
    call_for,
    signed_headers,
)
from services.dispatcher.connectors.http import HttpClient, NoAnswer, NotSent

__all__ = ["HostConnector"]


class HostConnector:
    """The host's REST write API, with its write credential (held by the dispatcher alone)."""

    name = "host"
    contract: Contract = "idempotent"

    def __init__(self, *, base_url: str, token: str, timeout_s: float = 10.0) -> None:
        self._client = HttpClient(base_url=base_url, token=token, timeout_s=timeout_s)

    async def execute(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        key: str,
        expected_revision: str | None,
        authorization: str | None = None,
    ) -> Result:
        """Perform `action` as its contract builds the request, under `key`."""
        call = call_for(self.name, action, arguments)
        if isinstance(call, Result):
            return call
        headers = signed_headers({"Idempotency-Key": key}, authorization)
        if (revision := expected_revision or call.if_match) is not None:
            headers["If-Match"] = revision
        try:
            response = await self._client.request(
                call.method, call.path, body=call.body_bytes(), headers=headers
            )
        except NotSent as exc:
            return Result(kind="transient", detail=f"connect failed: {exc}"[:500])
        except NoAnswer as exc:
            # It may have been applied: the same key again will tell (the host replays it).
            return Result(kind="lost", detail=f"no response: {exc}"[:500])
        failed = answer_of(
            response.status_code, response.text, ok=(200, 201), replay_safe=True, revisions=True
        )
        if failed is not None:
            return failed
        try:
            receipt = response.json()[call.receipt]
        except (ValueError, KeyError, TypeError):
            return Result(kind="lost", detail=f"the host's answer names no {call.receipt}")
        return Result(kind="succeeded", receipt=str(receipt)[:256])

    async def lookup(self, action: str, *, key: str) -> Result:
        """The host is idempotent, not queryable: replaying the key is how to find out."""
        return Result(kind="rejected", detail="the host is not queried by key: it is replayed")

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
