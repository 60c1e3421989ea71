"""Messages the dispatcher publishes: what is known about an executed command."""

from __future__ import annotations

from typing import Literal

from schemas.base import Event, Id, ShortText, Tenant

__all__ = ["CommandOutcome", "CommandState"]

CommandState = Literal[
    "succeeded", "denied", "expired", "revision_required", "unknown", "failed",
]


class CommandOutcome(Event):
    """A command reached a terminal state; `receipt` is the provider's proof where there is one."""

    tenant: Tenant
    operation_id: Id
    run_id: Id
    step: int
    action: ShortText
    state: CommandState
    receipt: ShortText | None = None
    reason: ShortText | None = None
