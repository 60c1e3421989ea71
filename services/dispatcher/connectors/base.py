"""What every connector is: a business system, and what its provider can prove (docs/design.md §5).

Each connector declares what its provider can establish after a lost response: `idempotent` (the
same key replays safely), `queryable` (the key can be looked up) or `none`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

from actions import ACTIONS
from actions.base import ProviderCall, ProviderLookup
from schemas.base import storable

__all__ = [
    "Connector",
    "Contract",
    "Result",
    "answer_of",
    "call_for",
    "lookup_for",
    "signed_headers",
]

Contract = Literal["idempotent", "queryable", "none"]

# The header carrying a command's approval receipt, beside the idempotency key (docs/receipts.md).
AUTHORIZATION_HEADER = "Writ-Authorization"


def signed_headers(headers: dict[str, str], authorization: str | None) -> dict[str, str]:
    """`headers` with the command's approval receipt, if admission signed one."""
    if authorization is not None:
        headers[AUTHORIZATION_HEADER] = authorization
    return headers


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What a call (or a lookup) established.

    `succeeded` / `rejected` / `revision_mismatch` are known; `transient` means the request
    certainly had no effect (refused before or without acting); `lost` means it may have had one;
    `not_found` (lookups only) means the provider has no operation under that key.
    """

    kind: Literal["succeeded", "rejected", "revision_mismatch", "transient", "lost", "not_found"]
    receipt: str | None = None
    detail: str = ""

    def __post_init__(self) -> None:
        # A provider's answer is untrusted text: what it proved is kept, in a form the store
        # can hold (a NUL in a receipt must not turn a done effect into endless retries).
        if self.receipt is not None:
            msgspec.structs.force_setattr(self, "receipt", storable(self.receipt))
        msgspec.structs.force_setattr(self, "detail", storable(self.detail))


def answer_of(
    status: int, text: str, *, ok: tuple[int, ...], replay_safe: bool, revisions: bool
) -> Result | None:
    """What an HTTP answer other than success establishes, for every HTTP connector (None: one
    of the `ok` statuses, whose body the connector reads for its receipt).

    `replay_safe`: the provider dedupes by the operation's key, so an answer that may come after
    the request was applied (a gateway's 502 or 504) is safe to retry and any other failure was
    the provider's refusal; otherwise such an answer is `lost`, as uncertain as a dropped
    connection (a retry could act twice). `revisions`: a 412 means the record moved on since
    the preview (`If-Match`).
    """
    if status in ok:
        return None
    if revisions and status == 412:
        return Result(kind="revision_mismatch", detail=text[:500])
    if status in (429, 503) or (replay_safe and status in (502, 504)):
        return Result(kind="transient", detail=f"HTTP {status}")
    if 400 <= status < 500 or replay_safe:
        return Result(kind="rejected", detail=f"HTTP {status}: {text}"[:500])
    return Result(kind="lost", detail=f"HTTP {status}: {text}"[:500])


class Connector(Protocol):
    """One business system."""

    name: str
    contract: Contract

    async def execute(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        key: str,
        expected_revision: str | None,
        authorization: str | None = None,
    ) -> Result:
        """Perform the action with `key` as the provider's idempotency key, forwarding
        `authorization` (the command's approval receipt) in `Writ-Authorization`."""
        ...

    async def lookup(self, action: str, *, key: str) -> Result:
        """What the provider knows of `key` (only meaningful for `queryable` connectors)."""
        ...

    async def aclose(self) -> None:
        """Release the connector's resources."""
        ...


def call_for(connector: str, action: str, arguments: dict[str, Any]) -> ProviderCall | Result:
    """The provider request of `action` as its contract builds it, from arguments decoded with
    the contract's own types; a `rejected` Result if this connector cannot perform it."""
    contract = ACTIONS.get(action)
    if contract is None or contract.connector != connector:
        return Result(kind="rejected", detail=f"{connector} cannot perform {action}")
    try:
        return contract.provider_call(contract.decode_arguments(arguments))
    except msgspec.ValidationError as exc:
        return Result(kind="rejected", detail=f"{action}: {exc}"[:500])


def lookup_for(connector: str, action: str, key: str) -> ProviderLookup | Result:
    """How to find what `action` made under `key`, or a `rejected` Result if nobody can."""
    contract = ACTIONS.get(action)
    lookup = (
        None
        if contract is None or contract.connector != connector
        else (contract.provider_lookup(key))
    )
    if lookup is None:
        return Result(kind="rejected", detail=f"{connector} cannot look up {action}")
    return lookup
