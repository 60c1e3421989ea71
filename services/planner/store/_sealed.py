"""A run's input and evidence sealed under its journal window key (`libs.journal.seal`), so
the retention policy's expiry and a principal's erasure reach `planner.runs` too."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal, WindowKeys, refresh, seal
from services.planner.store._rows import RunRow
from services.planner.store._sql import SealedRun, run_aad, run_row


def window_keys(journal: Journal | None) -> WindowKeys | None:
    """The journal's keys if they key payloads by window."""
    keys = None if journal is None else journal.keys
    return keys if isinstance(keys, WindowKeys) else None


async def sealed_run(
    journal: Journal | None, tenant: str, run_id: str, input_: str, evidence: Any
) -> bytes | None:
    """The run's input and evidence sealed under its window key (None: no window keys)."""
    keys = window_keys(journal)
    if keys is None or journal is None:
        return None
    await journal.prepare(tenant, run_id)
    key_id = keys.key_for(tenant, datetime.now(UTC), run_id)
    plain = msgspec.json.encode(SealedRun(input=input_, evidence=evidence))
    return seal(keys, key_id, plain, run_aad(run_id))


async def open_run(
    conn: asyncpg.Connection, journal: Journal | None, row: asyncpg.Record, *, again: bool = False
) -> RunRow:
    """The run of `row`, its sealed payload opened (its key read if this process does not
    hold it, or every time with `again`: what a person reads says expired once the key is
    destroyed, never answers from memory)."""
    keys = window_keys(journal)
    if keys is not None and row["sealed"] is not None:
        await refresh(conn, keys, [row["sealed"]], again=again)
    return run_row(row, keys)
