"""The SDK's errors: one class, carrying the stable `code` Writ answered with."""

from __future__ import annotations

from typing import Final

__all__ = ["RETRYABLE_CODES", "WritError"]

# A retry under the same idempotency key is safe for every code; these are worth it.
RETRYABLE_CODES: Final = frozenset({"UNAVAILABLE", "TIMEOUT", "INTERNAL", "NETWORK"})


class WritError(Exception):
    """Writ refused or could not answer; `code` is stable (docs/host-contract.md)."""

    def __init__(self, code: str, message: str = "", *, status: int | None = None) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code, self.message, self.status = code, message, status

    @property
    def retryable(self) -> bool:
        """Whether asking again (with the same key) may get an answer."""
        return self.code in RETRYABLE_CODES
