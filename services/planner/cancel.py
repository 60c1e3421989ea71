"""Cancelling a run (`schemas.control`): the request is kept, and the run ends `cancelled` at
the first point where nothing it started is still under way.

A request that arrives before the run exists is kept too: the run is created, then ends
cancelled before its first decision. A command already admitted is never undone or dropped:
the run waits for its outcome, observes it, and ends cancelled with it among its actions.
"""

from __future__ import annotations

from typing import Any

from schemas.control import RunCancelRequested
from services.planner.store import RunRow, Step

__all__ = ["cancelled_by", "in_flight", "record_cancel"]


async def record_cancel(conn: Any, event: RunCancelRequested) -> bool:
    """Keep the request (the first one: asking again changes nothing)."""
    return bool(
        await conn.fetchval(
            "INSERT INTO planner.cancellations (run_id, tenant, principal, request_id) "
            "VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING true",
            event.run_id,
            event.tenant,
            event.principal,
            event.request_id,
        )
    )


async def cancelled_by(conn: Any, run: RunRow) -> str | None:
    """Who asked to cancel the run (a principal of its own tenant), if anyone did."""
    return await conn.fetchval(
        "SELECT principal FROM planner.cancellations WHERE run_id = $1 AND tenant = $2",
        run.run_id,
        run.tenant,
    )


def in_flight(steps: list[Step]) -> bool:
    """Whether the run's last step handed a call to another service whose answer is still to
    come (a proposal, another agent): its outcome must be observed before the run ends."""
    if not steps:
        return False
    last = steps[-1]
    return (
        last.kind == "decision"
        and last.payload.get("decision") == "select_capability"
        and not str(last.payload.get("capability", "")).startswith("tool:")
    )
