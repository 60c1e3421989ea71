"""The facts a journaled decision is judged against, as admission recorded them.

Admission keeps, for every proposal it resolves (allowed, asked or denied), the facts its
contract resolved it against (`admission.resolved_facts`, readable by the auditor's read-only
role). A case built from a run is given, for each facts reference, the facts of the first
proposal of the run made at or after the case's step: for a selection acted on at once, its own
proposal; for a selection planned in a chat turn, the approved plan's step that proposed it
(which Writ refuses as stale if its facts changed since the plan was shown). A reference first
proposed before the step (the run read it again later) takes the last facts recorded before it.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import msgspec

__all__ = ["RecordedFacts", "facts_at", "recorded_facts"]


class RecordedFacts(msgspec.Struct, frozen=True, kw_only=True):
    """The facts one proposal of a run was resolved against."""

    step: int
    key: str  # "<kind>:<id>", as a case's `facts` names them
    facts: Any


async def recorded_facts(conn: asyncpg.Connection, tenant: str, run_id: str) -> list[RecordedFacts]:
    """What admission recorded for the run's proposals, in step order."""
    rows = await conn.fetch(
        "SELECT step, facts_kind, facts_id, facts FROM admission.resolved_facts "
        "WHERE tenant = $1 AND run_id = $2 ORDER BY step",
        tenant,
        run_id,
    )
    return [
        RecordedFacts(
            step=r["step"], key=f"{r['facts_kind']}:{r['facts_id']}", facts=json.loads(r["facts"])
        )
        for r in rows
    ]


def facts_at(recorded: list[RecordedFacts], step: int) -> dict[str, Any]:
    """The facts a decision at `step` is judged against (see the module docstring)."""
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for r in sorted(recorded, key=lambda r: r.step):
        if r.step >= step:
            after.setdefault(r.key, r.facts)  # the first at or after the step
        else:
            before[r.key] = r.facts  # the last before it
    return {**before, **after}
