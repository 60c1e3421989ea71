"""The CRM connector: notes on customer records, over the CRM's HTTP API."""

from __future__ import annotations

from typing import Any

from services.dispatcher.connectors.base import (
    Contract,
    Result,
    answer_of,
    call_for,
    lookup_for,
    signed_headers,
)
from services.dispatcher.connectors.http import HttpClient, NoAnswer, NotSent

__all__ = ["CrmConnector"]


class CrmConnector:
    """The CRM's HTTP API; it honours `Idempotency-Key`, so replaying a key is safe."""

    name = "crm"
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
        """Perform `action` (its contract says how) with `key` as the idempotency key."""
        call = call_for(self.name, action, arguments)
        if isinstance(call, Result):
            return call
        headers = signed_headers({"Idempotency-Key": key}, authorization)
        if expected_revision is not None:
            headers["If-Match"] = expected_revision
        try:
            response = await self._client.request(
                "POST", call.path, body=call.body_bytes(), headers=headers
            )
        except NotSent as exc:
            return Result(kind="transient", detail=f"connect failed: {exc}"[:500])
        except NoAnswer as exc:
            # The request may have been received and applied: only the key can tell.
            return Result(kind="lost", detail=f"no response: {exc}"[:500])
        failed = answer_of(
            response.status_code, response.text, ok=(200, 201), replay_safe=True, revisions=True
        )
        if failed is not None:
            return failed
        return Result(kind="succeeded", receipt=str(response.json()[call.receipt]))

    async def lookup(self, action: str, *, key: str) -> Result:
        """Find what was made under `key`, if anything (the CRM keeps every key it has seen)."""
        lookup = lookup_for(self.name, action, key)
        if isinstance(lookup, Result):
            return lookup
        try:
            response = await self._client.request("GET", lookup.path, params=lookup.params)
        except (NotSent, NoAnswer) as exc:
            return Result(kind="transient", detail=f"lookup failed: {exc}"[:500])
        if response.status_code != 200:
            return Result(kind="transient", detail=f"lookup HTTP {response.status_code}")
        made = response.json()[lookup.listed_as]
        if not made:
            return Result(kind="not_found")
        return Result(kind="succeeded", receipt=str(made[0][lookup.receipt]))

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
