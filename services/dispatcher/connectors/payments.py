"""The payment connector: charges through the payment provider's HTTP API.

The provider does not dedupe: it stores the caller's `Reference` on the charge, but a second POST
with the same reference is a second charge. So a response that may have been applied is `lost`,
never `transient`, and only a provider that can be queried by reference can say what happened.
"""

from __future__ import annotations

from typing import Any

import httpx

from services.dispatcher.connectors.base import Contract, Result

__all__ = ["PaymentConnector"]

_ACTION = "payment.charge.create"
_FIELDS = ("customer_id", "amount_cents", "currency", "description")


class PaymentConnector:
    """The payment provider's HTTP API; replaying a key charges again, so it is never replayed."""

    name = "payments"

    def __init__(self, *, base_url: str, token: str, queryable: bool,
                 timeout_s: float = 10.0) -> None:
        self.contract: Contract = "queryable" if queryable else "none"
        self._client = httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=2.0),
            headers={"Authorization": f"Bearer {token}"},
        )

    async def execute(self, action: str, arguments: dict[str, Any], *, key: str,
                      expected_revision: str | None) -> Result:
        """Charge once, sending `key` as the provider's `Reference` (which it does not dedupe)."""
        if action != _ACTION:
            return Result(kind="rejected", detail=f"payments cannot perform {action}")
        if expected_revision is not None:
            return Result(kind="rejected", detail="payments have no revisions to match")
        try:
            response = await self._client.post(
                "/v1/charges", json={f: arguments[f] for f in _FIELDS},
                headers={"Reference": key})
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # No connection was ever given the request, so nothing can have been charged.
            return Result(kind="transient", detail=f"connect failed: {exc!r}"[:500])
        except httpx.TransportError as exc:
            # The request may have been received and charged: only a lookup can tell.
            return Result(kind="lost", detail=f"no response: {exc!r}"[:500])
        status = response.status_code
        if status == 201:
            try:
                return Result(kind="succeeded", receipt=str(response.json()["charge_id"]))
            except (ValueError, KeyError, TypeError):
                # Charged for certain; a missing receipt must not turn into a second charge.
                return Result(kind="succeeded", detail=f"201 without a charge_id: "
                                                       f"{response.text}"[:500])
        if status in (429, 503):
            return Result(kind="transient", detail=f"HTTP {status}")
        if 400 <= status < 500:
            return Result(kind="rejected", detail=f"HTTP {status}: {response.text}"[:500])
        # A 500, or a gateway's 502/504, may come after the provider charged: a retry could
        # charge twice, so these are as uncertain as a dropped connection.
        return Result(kind="lost", detail=f"HTTP {status}: {response.text}"[:500])

    async def lookup(self, action: str, *, key: str) -> Result:
        """Find the charge made under `key`; more than one means the customer was overcharged."""
        if action != _ACTION:
            return Result(kind="rejected", detail=f"payments cannot look up {action}")
        try:
            response = await self._client.get("/v1/charges", params={"reference": key})
        except httpx.TransportError as exc:
            return Result(kind="transient", detail=f"lookup failed: {exc!r}"[:500])
        if response.status_code != 200:
            return Result(kind="transient",
                          detail=f"lookup HTTP {response.status_code}: {response.text}"[:500])
        try:
            ids = [str(charge["charge_id"]) for charge in response.json()["charges"]]
        except (ValueError, KeyError, TypeError):
            return Result(kind="transient", detail=f"lookup unreadable: {response.text}"[:500])
        if not ids:
            return Result(kind="not_found")
        if len(ids) > 1:
            return Result(kind="rejected",
                          detail=f"duplicate charges exist for {key}: {', '.join(ids)}"[:500])
        return Result(kind="succeeded", receipt=ids[0])

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
