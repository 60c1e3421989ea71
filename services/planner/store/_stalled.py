"""The runs the planner's sweeper drives again: running, and not locked by anyone for a while
(`touched_at`, set by every transaction that locks a run); and what became of the command a
stalled run's last decision proposed, read from admission's registry (granted read-only)."""

from __future__ import annotations

from typing import Final

import asyncpg
import msgspec

__all__ = ["LastCommand", "claim_stalled", "last_command"]

# Claims them in one statement: a run locked now (a delivery driving it) is skipped, and a
# claimed one is touched, so another planner's sweep passes it by until it stalls again.
_CLAIM: Final = """
UPDATE planner.runs AS r SET touched_at = now()
FROM (
    SELECT run_id FROM planner.runs
    WHERE status = 'running' AND touched_at < now() - make_interval(secs => $1)
    ORDER BY touched_at LIMIT $2
    FOR UPDATE SKIP LOCKED
) AS s
WHERE r.run_id = s.run_id
RETURNING r.tenant, r.run_id"""
# The command of the run's last step, if that step proposed one that admission admitted.
_LAST_COMMAND: Final = """
SELECT c.operation_id::text AS operation_id, c.step, c.action, c.state, c.receipt, c.reason
FROM admission.commands c
WHERE c.tenant = $1 AND c.run_id = $2
  AND c.step = (SELECT max(seq) FROM planner.steps WHERE run_id = $2)"""


class LastCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command as admission's registry records it."""

    operation_id: str
    step: int
    action: str
    state: str
    receipt: str | None
    reason: str | None


async def claim_stalled(
    conn: asyncpg.Connection, *, stall_s: float, limit: int
) -> list[tuple[str, str]]:
    """(tenant, run id) of up to `limit` running runs nobody drove for `stall_s` seconds."""
    rows = await conn.fetch(_CLAIM, stall_s, limit)
    return [(row["tenant"], row["run_id"]) for row in rows]


async def last_command(conn: asyncpg.Connection, tenant: str, run_id: str) -> LastCommand | None:
    """The command the run's last step proposed, if admission admitted one."""
    row = await conn.fetchrow(_LAST_COMMAND, tenant, run_id)
    return None if row is None else LastCommand(**dict(row))
