"""The dispatcher's per-tool circuit breakers: `libs.breaker`, shared with retrieval's `mcp:`
reads (docs/design.md §4)."""

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
    "outcome_of",
]
