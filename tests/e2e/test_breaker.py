"""The dispatcher's per-tool circuit breaker, against the real processes.

This module runs its own deployment (its own nats-server and PostgreSQL, like the fault suite)
with a short cooldown, so that an open breaker can be watched, and waited out, in seconds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

from schemas.host import SubmitCommand
from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

# Fixed by design (the agent-OS runtime view: "3 and 30 seconds, not configurable"), so the test
# waits them out.
THRESHOLD = 3
COOLDOWN_S = 30.0
TOOL = "crm.note.create"
STATE = f'writ_dispatcher_breaker_state{{tool="{TOOL}"}}'
REFUSED = f'writ_dispatcher_breaker_refused_total{{tool="{TOOL}"}}'
CLOSED, OPEN = 0.0, 2.0


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-breaker-") as home:
        deployment = Stack(
            Path(home),
            database="breaker",
            durable_pg=False,
            extra_env={
                "*": {"WRIT_DRAIN_TIMEOUT_S": "2"},
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


def metric(stack: Stack, sample: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port('dispatcher')}/metrics").text
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} not exported")


def calls(crm: httpx.Client) -> int:
    return int(crm.get("/_control/calls").json()["calls"])


def notes(crm: httpx.Client, operation_id: str) -> list[dict[str, Any]]:
    return [
        n
        for n in crm.get("/_control/notes").json()
        if n["idempotency_key"] == f"acme:{operation_id}"
    ]


async def command_rows(
    db: asyncpg.Connection, commands: list[SubmitCommand], timeout: float = 20
) -> list[asyncpg.Record]:
    keys = [c.operation_key for c in commands]
    with anyio.fail_after(timeout):
        while True:
            rows = await db.fetch(
                "SELECT * FROM admission.commands WHERE operation_key = ANY($1::text[])", keys
            )
            if len(rows) == len(keys):
                return sorted(rows, key=lambda r: keys.index(r["operation_key"]))
            await anyio.sleep(0.05)


async def attempts(db: asyncpg.Connection, operation_id: Any) -> list[str | None]:
    return [
        r["result"]
        for r in await db.fetch(
            "SELECT result FROM dispatcher.attempts WHERE operation_id = $1 ORDER BY attempt_id",
            operation_id,
        )
    ]


async def test_rejected_calls_do_not_open_the_breaker(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    refused_before, calls_before = metric(stack, REFUSED), calls(crm)
    # An unknown customer: the CRM answers 404, which the connector reports as `rejected`.
    unknown = [
        host.command(arguments={"customer_id": "NOPE-404", "body": "Nobody home."})
        for _ in range(THRESHOLD + 2)
    ]
    for command in unknown:
        await host.submit(command)
        assert (await host.wait_command(command.request_id)).status == "failed"

    assert metric(stack, STATE) == CLOSED
    assert calls(crm) == calls_before + len(unknown)  # every one reached the CRM
    good = host.command()
    await host.submit(good)
    result = await host.wait_command(good.request_id)
    assert result.status == "succeeded" and result.operation_id is not None
    assert len(notes(crm, result.operation_id)) == 1
    assert metric(stack, REFUSED) == refused_before
    for row in await command_rows(db, unknown):
        assert await attempts(db, row["operation_id"]) == ["failed"]


async def test_transient_failures_open_the_breaker_and_it_delays_without_calling(
    stack: Stack, host: Host, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    assert metric(stack, STATE) == CLOSED
    refused_before = metric(stack, REFUSED)
    crm.post("/_control/mode", json={"mode": "fail"})  # 503 on every note: transient

    # Each failing command retries by itself, so a few are enough to reach the threshold.
    failing = [host.command() for _ in range(THRESHOLD)]
    for command in failing:
        await host.submit(command)
    with anyio.fail_after(30):
        while metric(stack, STATE) != OPEN:
            await anyio.sleep(0.05)

    # A failing command's retry may have passed the breaker just before it opened: let those
    # calls finish, so the count below is of calls made while it was open.
    failing_ids = [row["operation_id"] for row in await command_rows(db, failing)]
    with anyio.fail_after(20):
        while await db.fetchval(
            "SELECT count(*) FROM dispatcher.attempts "
            "WHERE operation_id = ANY($1) AND finished_at IS NULL",
            failing_ids,
        ):
            await anyio.sleep(0.05)

    # While it is open, new commands are refused before the connector: no call, no attempt.
    calls_while_open = calls(crm)
    refused_at_open = metric(stack, REFUSED)
    delayed = [host.command() for _ in range(3)]
    for command in delayed:
        await host.submit(command)
    delayed_rows = await command_rows(db, delayed)
    with anyio.fail_after(COOLDOWN_S):
        while metric(stack, REFUSED) < refused_at_open + len(delayed):
            await anyio.sleep(0.05)
    held = [await _held_back(db, row["operation_id"]) for row in delayed_rows]
    attempt_rows = [await attempts(db, row["operation_id"]) for row in delayed_rows]
    crm_calls = calls(crm)
    early_results = [await host.results(c.request_id) for c in delayed]
    # Still open when those were read (a half-open call would have changed the state), so
    # everything above happened inside one cooldown.
    assert metric(stack, STATE) == OPEN
    crm.post("/_control/mode", json={"mode": "normal"})

    assert held == [True] * len(delayed)  # their leases wait out the cooldown
    assert crm_calls == calls_while_open
    assert attempt_rows == [[] for _ in delayed]
    # Delayed, not failed: the host has heard of no outcome for them.
    assert all(r.status in ("pending", "dispatching") for found in early_results for r in found)

    # The CRM is back; after the cooldown the next call half-opens the breaker and closes it.
    results = [
        await host.wait_command(c.request_id, timeout=COOLDOWN_S + 30) for c in failing + delayed
    ]
    assert [r.status for r in results] == ["succeeded"] * len(results)
    for result in results:
        assert result.operation_id is not None
        assert len(notes(crm, result.operation_id)) == 1
    for row in delayed_rows:  # each delayed command was attempted once: when it succeeded
        assert await attempts(db, row["operation_id"]) == ["succeeded"]
    for row in await command_rows(db, failing):
        found = await attempts(db, row["operation_id"])
        assert found[-1] == "succeeded" and set(found[:-1]) <= {"transient"}
    assert metric(stack, STATE) == CLOSED
    assert metric(stack, REFUSED) >= refused_before + len(delayed)


async def _held_back(db: asyncpg.Connection, operation_id: Any) -> bool:
    row = await db.fetchrow(
        "SELECT state, lease_until > now() + interval '10 seconds' AS held "
        "FROM admission.commands WHERE operation_id = $1",
        operation_id,
    )
    return row is not None and row["state"] == "dispatching" and bool(row["held"])
