"""What the planner's store reads and writes: runs, steps, reservations."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["TERMINAL_RUN", "Reservation", "RunRow", "RunState", "Step"]

TERMINAL_RUN = frozenset({"succeeded", "failed", "cancelled"})


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """One run as the planner recorded it."""

    run_id: str
    tenant: str
    request_id: str
    principal: str
    agent: str
    input: str
    evidence: list[dict[str, Any]]
    status: str
    answer: str | None
    error_code: str | None
    error_message: str | None
    attended: bool = False
    # The agent snapshot the run started with (version, responsibility, catalog), or None.
    manifest: dict[str, Any] | None = None
    # The decision a stopped run waits for a person to take (a pending decision's id, or a
    # review's), None while it runs or once it ended.
    pending_id: str | None = None
    # How many times what the host sees of the run changed (`RunResult.version`).
    state_version: int = 0
    # The window key of its input and evidence, if that key was destroyed (retention or an
    # erasure): then `input` is empty and `evidence` `[]`, and nothing may stand in for them.
    expired: str | None = None


class Step(msgspec.Struct, frozen=True, kw_only=True):
    """A captured model decision or an observation fed back to the model."""

    seq: int
    kind: str
    payload: dict[str, Any]


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A budget reservation of the run's, as the planner recorded it."""

    step_key: str
    reservation_id: str
    state: str  # open | due | closed
    # What the step used (recorded when it is spent; a lease's: what its draws used).
    provider_calls: int = 0
    tokens: int = 0
    capability_calls: int = 0
    # A draw on a lease (`budgeting.py`): the lease's step key, and what the draw holds of it;
    # a lease: what governance granted, and until when it may be drawn on (epoch seconds).
    lease: str | None = None
    reserved_provider_calls: int = 0
    reserved_tokens: int = 0
    reserved_capability_calls: int = 0
    expires_at: float | None = None


class RunState(msgspec.Struct, frozen=True, kw_only=True):
    """What the planner reads of a locked run in one statement: its steps, who asked to
    cancel it, and its budget reservations."""

    steps: list[Step]
    cancelled_by: str | None = None
    reservations: list[Reservation] = []
    now: float = 0.0  # the database's clock (epoch seconds), which a lease expires by
