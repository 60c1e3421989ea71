"""Readings shared by the integration tests (no fixtures: those are in conftest.py)."""

from __future__ import annotations

from typing import Any


async def planner_draws(db: Any, run_id: str) -> list[tuple[str, str | None, str]]:
    """The planner's own budget record of a run: each step key, the lease it drew on (or
    None), its state; keys without the run's prefix, in key order."""
    rows = await db.fetch(
        "SELECT step_key, lease, state FROM planner.reservations "
        "WHERE run_id = $1 ORDER BY step_key",
        run_id,
    )
    return [
        (
            r["step_key"].removeprefix(f"{run_id}:"),
            r["lease"] and r["lease"].removeprefix(f"{run_id}:"),
            r["state"],
        )
        for r in rows
    ]
