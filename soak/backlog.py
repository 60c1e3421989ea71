"""Where a backlog waits while the soak settles: each JetStream consumer's messages not yet
delivered and delivered but not acknowledged, the admission outbox's rows not yet relayed, and
what PostgreSQL's busy sessions wait on (`pg_stat_activity`). Logged beside the settle's count,
it says which stage a drain is bounded by: a consumer whose pending count falls slowest while
the others are empty, or sessions queued on one lock."""

from __future__ import annotations

from typing import Any

import asyncpg

from soak.deploy import admin_connect
from writ.stack import Stack

__all__ = ["backlog"]

_WAITS = """
SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, '-') AS what, count(*)
FROM pg_stat_activity
WHERE state IN ('active', 'idle in transaction') AND pid <> pg_backend_pid()
GROUP BY 1 ORDER BY 2 DESC LIMIT 6"""


async def backlog(stack: Stack, db: asyncpg.Connection) -> dict[str, Any]:
    """{consumers: {"<stream>/<consumer>": [pending, ack pending]}, outbox, pg_waits}, only
    the consumers with something waiting."""
    consumers: dict[str, list[int]] = {}
    nc = await admin_connect(stack, connect_timeout=5, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        for stream in await js.streams_info():
            name = stream.config.name or ""
            for info in await js.consumers_info(name):
                waiting = [info.num_pending or 0, info.num_ack_pending or 0]
                if any(waiting):
                    consumers[f"{name}/{info.name}"] = waiting
    finally:
        await nc.close()
    outbox = await db.fetchval("SELECT count(*) FROM admission.outbox")
    waits = {r["what"]: r["count"] for r in await db.fetch(_WAITS)}
    return {"consumers": consumers, "outbox": outbox, "pg_waits": waits}
