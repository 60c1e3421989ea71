"""The dispatcher's per-tool circuit breakers: `libs.breaker`, shared with retrieval's `mcp:`
reads (docs/design.md §4), and what a call's result means to them here.

Only the connector's own transient failures count. A call that took far longer
than the connector's timeout was not the tool failing to answer in time: this process was
held up (stopped, starved, its event loop blocked while NATS elected a leader), and the
provider's answer, if any, found nobody reading. Such a result is `neutral`: it neither opens
nor closes a breaker. Nothing of the bus ever reaches a breaker: a publish or a lease renewal
that fails is the delivery's to retry, not the tool's.
"""

from typing import Final

from libs.breaker import (
    STATE_VALUES,
    Admission,
    Breakers,
    BreakerState,
    CircuitBreaker,
    Outcome,
    outcome_of,
)

__all__ = [
    "STATE_VALUES",
    "Admission",
    "BreakerState",
    "Breakers",
    "CircuitBreaker",
    "Outcome",
    "call_outcome",
    "outcome_of",
]

# A call's time beyond its timeout that still counts as the tool's: past it, this side stalled.
HELD_UP_FACTOR: Final = 1.5


def call_outcome(kind: str, *, elapsed_s: float, timeout_s: float) -> Outcome:
    """What a connector's `Result.kind` means to the breaker, given how long the call took."""
    outcome = outcome_of(kind)
    if outcome == "transient" and elapsed_s > timeout_s * HELD_UP_FACTOR:
        return "neutral"
    return outcome
