"""Request ids: every write carries one, and a retry sends the same one again."""

from __future__ import annotations

import uuid

__all__ = ["new_key"]


def new_key(prefix: str = "req") -> str:
    """A fresh request id (an Idempotency-Key, a `Nats-Msg-Id`)."""
    return f"{prefix}-{uuid.uuid4().hex}"
