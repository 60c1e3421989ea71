"""Run budgets: the limits a run gets, and whether a step's reservation fits what is left.

Pure decisions, no I/O: the store reads the run's budget row under a lock and asks `refusal`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from schemas.governance import BudgetKind, RunBudget

__all__ = ["BudgetDefaults", "BudgetState", "Limits", "leased", "refusal"]


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A run's limits, every one of them set."""

    provider_calls: Annotated[int, msgspec.Meta(ge=0)] = 50
    tokens: Annotated[int, msgspec.Meta(ge=0)] = 200_000
    capability_calls: Annotated[int, msgspec.Meta(ge=0)] = 50
    wall_time_s: Annotated[int, msgspec.Meta(ge=1)] = 900
    max_concurrent_steps: Annotated[int, msgspec.Meta(ge=1)] = 4

    def over(self, budget: RunBudget | None) -> Limits:
        """These limits with what `budget` sets replacing them (the operator's configuration:
        an agent's limits over the global ones)."""
        if budget is None:
            return self
        given = {f: v for f in budget.__struct_fields__ if (v := getattr(budget, f)) is not None}
        return msgspec.structs.replace(self, **given)

    def lowered(self, budget: RunBudget | None) -> Limits:
        """These limits, each lowered to what `budget` asks where it asks less (what a host
        or a manifest asks: it can tighten a run's budget, never widen it)."""
        if budget is None:
            return self
        lower = {
            f: v
            for f in budget.__struct_fields__
            if (v := getattr(budget, f)) is not None and v < getattr(self, f)
        }
        return msgspec.structs.replace(self, **lower) if lower else self


class BudgetDefaults(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Governance's defaults (`WRIT_BUDGETS_FILE`): global limits, then per agent."""

    default: Limits = Limits()
    agents: dict[str, RunBudget] = {}

    def limits_for(self, agent: str, asked: RunBudget | None) -> Limits:
        """What the registered run gets: the agent's limits over the global ones, lowered to
        what the run's host asked."""
        return self.default.over(self.agents.get(agent)).lowered(asked)


class BudgetState(msgspec.Struct, frozen=True, kw_only=True):
    """A run's budget as read under its row lock."""

    limits: Limits
    reserved_provider_calls: int = 0
    reserved_tokens: int = 0
    reserved_capability_calls: int = 0
    used_provider_calls: int = 0
    used_tokens: int = 0
    used_capability_calls: int = 0
    open_steps: int = 0
    elapsed_s: float = 0.0  # the run's clock, less the time it waited for a person

    def remaining(self, kind: str) -> int:
        """limit - settled - reserved (open) for one countable budget; may be negative."""
        limit: int = getattr(self.limits, kind)
        return limit - getattr(self, f"used_{kind}") - getattr(self, f"reserved_{kind}")

    @property
    def wall_time_left_s(self) -> float:
        """Seconds left on the run's clock (never negative)."""
        return max(0.0, self.limits.wall_time_s - self.elapsed_s)


def refusal(
    state: BudgetState, *, provider_calls: int, tokens: int, capability_calls: int
) -> tuple[BudgetKind, str] | None:
    """Which budget a new step asking these amounts would exceed (and why), or None if it fits.

    A run out of time or at its concurrency cap schedules no step at all; a countable budget
    refuses a step only for what it asks (a step that needs no tokens is not refused tokens).
    """
    if state.elapsed_s >= state.limits.wall_time_s:
        return (
            "wall_time",
            f"wall time exhausted: {state.elapsed_s:.1f}s of "
            f"{state.limits.wall_time_s}s used (waiting for people excluded)",
        )
    if state.open_steps >= state.limits.max_concurrent_steps:
        return (
            "concurrent_steps",
            f"{state.open_steps} steps in flight, at most {state.limits.max_concurrent_steps}",
        )
    asked: tuple[tuple[BudgetKind, int], ...] = (
        ("provider_calls", provider_calls),
        ("tokens", tokens),
        ("capability_calls", capability_calls),
    )
    for kind, amount in asked:
        left = state.remaining(kind)
        if amount > 0 and amount > left:
            return (
                kind,
                f"{kind.replace('_', ' ')} budget exhausted: asked {amount}, "
                f"{max(left, 0)} left of {getattr(state.limits, kind)}",
            )
    return None


def leased(state: BudgetState, asked: dict[str, int], up_to: dict[str, int]) -> dict[str, int]:
    """What a lease reserves once `asked` fits (`refusal` said None): each countable budget
    raised to what is left of it, up to `up_to`, and never below what was asked."""
    return {
        kind: max(amount, min(up_to.get(kind, 0), state.remaining(kind)))
        for kind, amount in asked.items()
    }
