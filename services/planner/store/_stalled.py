"""The runs the planner's sweeper drives again: running, and not locked by anyone for a while
(`touched_at`, set by every transaction that locks a run)."""

from __future__ import annotations

from typing import Final

import asyncpg

__all__ = ["claim_stalled"]

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


async def claim_stalled(
    conn: asyncpg.Connection, *, stall_s: float, limit: int
) -> list[tuple[str, str]]:
    """(tenant, run id) of up to `limit` running runs nobody drove for `stall_s` seconds."""
    rows = await conn.fetch(_CLAIM, stall_s, limit)
    return [(row["tenant"], row["run_id"]) for row in rows]
