"""The no-op connector: `writ.noop` succeeds without touching anything (canary, benchmark)."""

from __future__ import annotations

from typing import Any

from services.dispatcher.connectors.base import Contract, Result

__all__ = ["NoopConnector"]


class NoopConnector:
    """Succeeds at once; replaying a key is trivially safe."""

    name = "noop"
    contract: Contract = "idempotent"

    async def execute(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        key: str,
        expected_revision: str | None,
        authorization: str | None = None,
    ) -> Result:
        """Do nothing, and say so with a receipt naming the key."""
        return Result(kind="succeeded", receipt=f"noop:{key}"[:500])

    async def lookup(self, action: str, *, key: str) -> Result:
        """Every key was, trivially, done."""
        return Result(kind="succeeded", receipt=f"noop:{key}"[:500])

    async def aclose(self) -> None:
        """Nothing to release."""
