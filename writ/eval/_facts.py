"""The facts a journaled decision is judged against, as admission and governance recorded them.

Admission keeps, for every proposal it resolves (allowed, asked or denied), the facts its
contract resolved it against, and for every step of a chat turn's plan the facts it read when
the plan was proposed, under the planned selection's step (`admission.resolved_facts`, readable
by the auditor's read-only role; `services/admission/_plan_facts.py`). A case built from a run
is given, for each facts reference, the facts of the first row of the run at or after the
case's step: for a selection acted on at once, its own proposal's; for a selection planned in a
chat turn, the ones its plan was shown with, whether the plan was approved or rejected. A
reference first recorded before the step (the run read it again later) takes the last facts
recorded before it.

The policy a case's calls are ruled with is the one governance journaled with its decision on
that same proposal (`services/governance/recorded.py`: the org policy, the standing and run
grants, the rules naming the call's tool), read from governance's sealed journal with its data
keys. A case none was recorded for keeps the policy given (`--policy`), else the default.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import msgspec

from libs.journal import Journal, read_entries
from services.admission.logic import proposal_id_for
from services.governance.recorded import RecordedFacts as GovernanceFacts

__all__ = ["RecordedFacts", "facts_at", "policy_at", "recorded_facts", "recorded_policies"]


class _Decision(msgspec.Struct, frozen=True, kw_only=True):
    """Of a `decision` row of governance's journal, what names its proposal and its facts."""

    proposal_id: str | None = None
    facts: GovernanceFacts | None = None


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


async def recorded_policies(
    conn: asyncpg.Connection, governance: Journal, tenant: str, run_id: str
) -> dict[str, dict[str, Any]]:
    """The policy governance ruled each of the run's proposals with, by proposal id (its first
    decision on it), from its sealed journal."""
    out: dict[str, dict[str, Any]] = {}
    for _, row, plaintext in await read_entries(conn, governance, tenant=tenant, run_id=run_id):
        if row["kind"] != "decision":
            continue
        d = msgspec.json.decode(plaintext, type=_Decision)
        if d.proposal_id is not None and d.facts is not None:
            out.setdefault(d.proposal_id, msgspec.to_builtins(d.facts))
    return out


def policy_at(
    policies: dict[str, dict[str, Any]], tenant: str, run_id: str, step: int, last: int
) -> dict[str, Any] | None:
    """The policy of the run's first proposal made at `step` or after (up to `last`)."""
    if not policies:
        return None
    for s in range(step, last + 1):
        if (found := policies.get(proposal_id_for(tenant, run_id, s))) is not None:
            return found
    return None
