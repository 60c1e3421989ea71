"""Per-tool circuit breakers (docs/design.md §4, last paragraph; §6): pure decisions, no I/O.

Only transient failures count: `threshold` in a row open the breaker; a success closes it and
resets the count; a permanent error, an invalid argument, an expiry or a denial leaves it as it
is. There is no timer: an open breaker turns half-open only when a call arrives after the
cooldown, so a tool nobody calls stays open. Half-open admits every call that arrives (no
single probe slot a crashed call could hold for ever) and the first result decides; the later
results of that batch change nothing.

Each result is tied to the period of the breaker that admitted its call (`generation`): a result
that comes back after the breaker moved on, e.g. a call admitted while closed that ends after the
breaker opened, is ignored rather than allowed to overturn a newer decision.

These breakers are process-local: each dispatcher replica keeps its own, so a failing tool is
cut off replica by replica (retrieval keeps its own for `mcp:` reads); sharing
the state would put a network round trip in front of every call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, Literal

import msgspec

# `BreakerState` and `Outcome` (Literal aliases) are importable too, outside `__all__`.
__all__ = ["STATE_VALUES", "Admission", "Breakers", "CircuitBreaker", "outcome_of"]

BreakerState = Literal["closed", "half_open", "open"]
Outcome = Literal["success", "transient", "neutral"]

# The gauge's encoding of a state (0 closed, 1 half_open, 2 open): higher is worse.
STATE_VALUES: Final[dict[str, int]] = {"closed": 0, "half_open": 1, "open": 2}

_TRANSIENT_KINDS: Final = frozenset({"transient", "lost"})


def outcome_of(kind: str) -> Outcome:
    """What a connector `Result.kind` means to the breaker."""
    if kind == "succeeded":
        return "success"
    if kind in _TRANSIENT_KINDS:
        return "transient"
    # A refusal on the merits (rejected, revision_mismatch) proves nothing about the tool's health.
    return "neutral"


def _check(threshold: int, cooldown_s: float) -> None:
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, not {threshold}")
    if cooldown_s < 0:
        raise ValueError(f"cooldown_s must not be negative, not {cooldown_s}")


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """Whether a call may go ahead; if refused, how long until the breaker will try again."""

    allowed: bool
    retry_after_s: float = 0.0
    generation: int = 0  # the breaker period that admitted the call; its result is judged in it


class CircuitBreaker:
    """One tool's breaker: closed, open or half-open."""

    def __init__(
        self,
        *,
        threshold: int = 3,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        _check(threshold, cooldown_s)
        self._threshold, self._cooldown_s, self._clock = threshold, cooldown_s, clock
        self._on_change = on_change
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._generation = 0

    @property
    def state(self) -> BreakerState:
        """The current state; reading it never moves the breaker (there is no timer)."""
        return self._state

    def admit(self) -> Admission:
        """Allow the call, or refuse it with the remaining cooldown; open turns half-open here."""
        if self._state == "open":
            remaining = self._opened_at + self._cooldown_s - self._clock()
            if remaining > 0:
                return Admission(
                    allowed=False, retry_after_s=remaining, generation=self._generation
                )
            self._move("half_open")
        return Admission(allowed=True, generation=self._generation)

    def record(self, admission: Admission, outcome: Outcome) -> None:
        """Account for the result of a call this breaker admitted."""
        if not admission.allowed:
            raise ValueError("a refused call has no result to record")
        if admission.generation != self._generation or outcome == "neutral":
            return
        if outcome == "success":
            self._failures = 0
            if self._state == "half_open":
                self._move("closed")
        elif self._state == "half_open":
            self._open()
        else:
            self._failures += 1
            if self._failures >= self._threshold:
                self._open()

    def _open(self) -> None:
        self._opened_at = self._clock()
        self._failures = 0
        self._move("open")

    def _move(self, state: BreakerState) -> None:
        # A new period: results of calls admitted in the previous one no longer count.
        self._generation += 1
        self._state = state
        if self._on_change is not None:
            self._on_change(state)


class Breakers:
    """One `CircuitBreaker` per tool, made (closed) on first use; `on_change` sees each move."""

    def __init__(
        self,
        *,
        threshold: int = 3,
        cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        _check(threshold, cooldown_s)
        self._threshold, self._cooldown_s, self._clock = threshold, cooldown_s, clock
        self._on_change = on_change
        self._breakers: dict[str, CircuitBreaker] = {}

    def for_tool(self, tool: str) -> CircuitBreaker:
        """The tool's breaker, created closed on first use."""
        breaker = self._breakers.get(tool)
        if breaker is None:
            notify = self._on_change
            breaker = CircuitBreaker(
                threshold=self._threshold,
                cooldown_s=self._cooldown_s,
                clock=self._clock,
                on_change=None if notify is None else lambda state: notify(tool, state),
            )
            self._breakers[tool] = breaker
        return breaker

    def states(self) -> dict[str, BreakerState]:
        """Every known tool's current state."""
        return {tool: breaker.state for tool, breaker in self._breakers.items()}
