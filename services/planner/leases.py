"""A run's lease from the planner's side: the draws steps make on it (budgeting.py)."""

from __future__ import annotations

from services.planner.store import Reservation

__all__ = ["draw", "drawn"]


def draw(key: str, lease: Reservation, need: tuple[int, int, int]) -> Reservation:
    """A step's draw on `lease`, holding what it needs of it."""
    return Reservation(
        step_key=key,
        reservation_id=lease.reservation_id,
        state="open",
        lease=lease.step_key,
        reserved_provider_calls=need[0],
        reserved_tokens=need[1],
        reserved_capability_calls=need[2],
    )


def drawn(known: dict[str, Reservation], lease: Reservation) -> tuple[int, int, int] | None:
    """What the draws on `lease` used together; None while one of them is open."""
    draws = [r for r in known.values() if r.lease == lease.step_key]
    if any(r.state == "open" for r in draws):
        return None
    return (
        sum(r.provider_calls for r in draws),
        sum(r.tokens for r in draws),
        sum(r.capability_calls for r in draws),
    )
