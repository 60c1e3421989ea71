"""What every connector is: a business system, and what its provider can prove (DESIGN.md §5).

Each connector declares what its provider can establish after a lost response: `idempotent` (the
same key replays safely), `queryable` (the key can be looked up) or `none`.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import msgspec

__all__ = ["Connector", "Contract", "Result"]

Contract = Literal["idempotent", "queryable", "none"]


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """What a call (or a lookup) established.

    `succeeded` / `rejected` / `revision_mismatch` are known; `transient` means the request
    certainly had no effect (refused before or without acting); `lost` means it may have had one;
    `not_found` (lookups only) means the provider has no operation under that key.
    """

    kind: Literal["succeeded", "rejected", "revision_mismatch", "transient", "lost",
                  "not_found"]
    receipt: str | None = None
    detail: str = ""


class Connector(Protocol):
    """One business system."""

    name: str
    contract: Contract

    async def execute(self, action: str, arguments: dict[str, Any], *, key: str,
                      expected_revision: str | None) -> Result:
        """Perform the action with `key` as the provider's idempotency key."""
        ...

    async def lookup(self, action: str, *, key: str) -> Result:
        """What the provider knows of `key` (only meaningful for `queryable` connectors)."""
        ...

    async def aclose(self) -> None:
        """Release the connector's resources."""
        ...
