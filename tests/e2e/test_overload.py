"""Governance falling behind does not keep it behind (docs/soak.md): requests whose
callers gave up while it was frozen are dropped on waking, before any work, and the next
request is answered.

The soak found the metastable overload: governance, slowed by PostgreSQL kills and frozen
processes, woke to a backlog of `decide` requests whose callers had already timed out and were
retrying, answered them all (recording a decision for each), and never caught up. Now every
request carries its caller's deadline (`Writ-Deadline`, libs/deadline.py) and `libs.runtime`'s
endpoints drop the expired ones unanswered.
"""

from __future__ import annotations

import signal
import uuid

import anyio
import asyncpg
import httpx
import pytest

from libs.decide import DecideUnavailable, decide
from schemas.governance import DecideRequest
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ABANDONED = 20


def _ask(run_id: str) -> DecideRequest:
    return DecideRequest(
        tenant="acme",
        principal="alice@acme.example",
        agent="crm-assistant",
        run_id=run_id,
        tool="crm.note.create",
    )


def _expired(stack: Stack) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port('governance')}/metrics").text
    sample = 'writ_requests_dropped_total{endpoint="decide",reason="expired",service="governance"}'
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_decides_abandoned_while_governance_was_frozen_are_dropped_unrecorded(
    stack: Stack, host: Host, db: asyncpg.Connection
) -> None:
    prefix = f"overload-{uuid.uuid4().hex[:8]}"
    before = _expired(stack)
    governance = stack.procs["governance"]
    abandoned: list[str] = []

    async def give_up(run_id: str) -> None:
        with pytest.raises(DecideUnavailable):
            await decide(host.nc, _ask(run_id), timeout=0.5)
        abandoned.append(run_id)

    governance.send_signal(signal.SIGSTOP)  # it falls behind: requests pile up unread
    try:
        async with anyio.create_task_group() as tg:
            for i in range(ABANDONED):
                tg.start_soon(give_up, f"{prefix}-late-{i}")
    finally:
        governance.send_signal(signal.SIGCONT)
    # Every caller has given up; governance wakes to their requests first, then this one.
    fresh = await decide(host.nc, _ask(f"{prefix}-fresh"), timeout=30)

    recorded = await db.fetch(
        "SELECT run_id, verdict FROM governance.decisions WHERE run_id LIKE $1", f"{prefix}-%"
    )
    assert len(abandoned) == ABANDONED
    assert fresh.verdict == "allow"  # the demo agent's standing grant
    # The abandoned ones were dropped on arrival, before the fresh one was even dispatched:
    # none was decided, so none recorded a decision nobody would read.
    assert [(r["run_id"], r["verdict"]) for r in recorded] == [(f"{prefix}-fresh", "allow")]
    assert _expired(stack) - before >= ABANDONED
