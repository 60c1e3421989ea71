"""The payment connector: charges and refunds through the payment provider's HTTP API.

The provider does not dedupe: it stores the caller's `Reference` on the charge or refund, but a
second POST with the same reference is a second charge (or refund). So a response that may have
been applied is `lost`, never `transient`, and only a provider that can be queried by reference
can say what happened.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from libs.errors import PermanentError, RetryableError
from services.dispatcher.connectors.base import (
    Contract,
    Result,
    answer_of,
    call_for,
    lookup_for,
    signed_headers,
)
from services.dispatcher.connectors.http import HttpClient, NoAnswer, NotSent

__all__ = ["PaymentConnector", "ReadFailed", "PaymentReadRefused"]


class ReadFailed(RetryableError):
    """The payment could not be read now (no connection, a timeout, 429 or 5xx): try later."""

    def __init__(self, msg: str, *, payment_id: str, status: int | None = None) -> None:
        super().__init__(msg)
        self.payment_id, self.status = payment_id, status


class PaymentReadRefused(PermanentError):
    """The provider refused to read the payment (e.g. 401): retrying cannot help."""

    def __init__(self, msg: str, *, payment_id: str, status: int) -> None:
        super().__init__(msg)
        self.payment_id, self.status = payment_id, status


class PaymentConnector:
    """The payment provider's HTTP API; replaying a key pays out again, so it is never replayed."""

    name = "payments"

    def __init__(
        self, *, base_url: str, token: str, queryable: bool, timeout_s: float = 10.0
    ) -> None:
        self.contract: Contract = "queryable" if queryable else "none"
        self._client = HttpClient(base_url=base_url, token=token, timeout_s=timeout_s)

    async def read_payment(self, payment_id: str) -> dict[str, Any] | None:
        """The payment as the provider shows it now, or None if it has no such payment.

        The provider adds `amount_cents`, `refunded_cents` and `refunds` to the payment, and
        `refunded_cents` to each line.

        Raises:
            ReadFailed: the provider could not answer now (retryable).
            PaymentReadRefused: the provider refused the read, e.g. a bad token (permanent).
        """
        try:
            response = await self._client.request(
                "GET", f"/v1/payments/{quote(payment_id, safe='')}"
            )
        except (NotSent, NoAnswer) as exc:
            raise ReadFailed(
                f"reading payment {payment_id} failed: {exc}"[:500], payment_id=payment_id
            ) from exc
        status = response.status_code
        if status == 404:
            return None
        if status == 200:
            try:
                payment = response.json()
            except ValueError:
                payment = None
            if isinstance(payment, dict):
                return payment
            raise ReadFailed(
                f"payment {payment_id} unreadable: {response.text}"[:500],
                payment_id=payment_id,
                status=status,
            )
        if status == 429 or status >= 500:
            raise ReadFailed(
                f"reading payment {payment_id}: HTTP {status}", payment_id=payment_id, status=status
            )
        raise PaymentReadRefused(
            f"reading payment {payment_id}: HTTP {status}: {response.text}"[:500],
            payment_id=payment_id,
            status=status,
        )

    async def execute(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        key: str,
        expected_revision: str | None,
        authorization: str | None = None,
    ) -> Result:
        """Charge or refund once, sending `key` as the (never deduped) `Reference`."""
        if expected_revision is not None:
            return Result(kind="rejected", detail="payments have no revisions to match")
        op = call_for(self.name, action, arguments)  # the action's contract says what to send
        if isinstance(op, Result):
            return op
        try:
            response = await self._client.request(
                "POST",
                op.path,
                body=op.body_bytes(),
                headers=signed_headers({"Reference": key}, authorization),
            )
        except NotSent as exc:
            # No connection was ever given the request, so nothing can have been applied.
            return Result(kind="transient", detail=f"connect failed: {exc}"[:500])
        except NoAnswer as exc:
            # The request may have been received and applied: only a lookup can tell.
            return Result(kind="lost", detail=f"no response: {exc}"[:500])
        # The provider cannot dedupe: a 500, or a gateway's 502/504, may come after it applied
        # the request, so those are `lost`. For a refund a 409 says why the provider refused it
        # (nothing left to refund, the payment is not captured, the destination no longer
        # matches): the detail carries it.
        failed = answer_of(
            response.status_code, response.text, ok=(201,), replay_safe=False, revisions=False
        )
        if failed is not None:
            return failed
        try:
            return Result(kind="succeeded", receipt=str(response.json()[op.receipt]))
        except (ValueError, KeyError, TypeError):
            # Applied for certain; a missing receipt must not turn into a second one.
            return Result(
                kind="succeeded", detail=f"201 without a {op.receipt}: {response.text}"[:500]
            )

    async def lookup(self, action: str, *, key: str) -> Result:
        """Find what was made under `key`; more than one means a duplicate charge or refund."""
        op = lookup_for(self.name, action, key)
        if isinstance(op, Result):
            return op
        try:
            response = await self._client.request("GET", op.path, params=op.params)
        except (NotSent, NoAnswer) as exc:
            return Result(kind="transient", detail=f"lookup failed: {exc}"[:500])
        if response.status_code != 200:
            return Result(
                kind="transient",
                detail=f"lookup HTTP {response.status_code}: {response.text}"[:500],
            )
        try:
            ids = [str(made[op.receipt]) for made in response.json()[op.listed_as]]
        except (ValueError, KeyError, TypeError):
            return Result(kind="transient", detail=f"lookup unreadable: {response.text}"[:500])
        if not ids:
            return Result(kind="not_found")
        if len(ids) > 1:
            return Result(
                kind="rejected",
                detail=f"duplicate {op.listed_as} exist for {key}: {', '.join(ids)}"[:500],
            )
        return Result(kind="succeeded", receipt=ids[0])

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
