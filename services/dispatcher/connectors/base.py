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

__all__ = ["Connector", "Contract", "Result", "call_for", "lookup_for"]

Contract = Literal["idempotent", "queryable", "none"]


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


class Connector(Protocol):
    """One business system."""

    name: str
    contract: Contract

    async def execute(
        self, action: str, arguments: dict[str, Any], *, key: str, expected_revision: str | None
    ) -> Result:
        """Perform the action with `key` as the provider's idempotency key."""
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
