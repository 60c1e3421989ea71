"""Cancelling a run (`POST /runs/{id}/cancel`, `writ.in.cancels.<tenant>`) before, during and
after it, through the six real processes: nothing more is scheduled, an admitted command runs
to its recorded outcome, the run ends `cancelled` with what was done, the host gets its
`RunResult`; cancelling again changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import asyncpg
import httpx
import msgspec
import pytest

from schemas.control import CancelRun, cancel
from services.ingress.logic import run_id_for
from tests.e2e.conftest import Host, notes_for
from tests.e2e.test_http_api import BODY, auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        yield client


async def _steps(db: asyncpg.Connection, run_id: str) -> list[tuple[str, str | None]]:
    return [
        tuple(r)
        for r in await db.fetch(
            "SELECT kind, payload->>'decision' FROM planner.steps WHERE run_id = $1 ORDER BY seq",
            run_id,
        )
    ]


async def test_a_cancel_before_the_run_exists_ends_it_before_its_first_decision(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection, crm: httpx.Client
) -> None:
    request_id = f"early-{uuid.uuid4().hex[:12]}"
    run_id = run_id_for("acme", request_id)
    cancelled = api.post(f"/runs/{run_id}/cancel", headers={**auth(stack), **key()})
    assert cancelled.status_code == 202, cancelled.text
    started = api.post("/runs", json=BODY, headers={**auth(stack), "Idempotency-Key": request_id})
    assert started.json()["run_id"] == run_id
    result = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert (result["status"], result["error"]["code"]) == ("cancelled", "CANCELLED")
    assert result["actions"] == []
    assert await _steps(db, run_id) == []
    assert (
        await db.fetchval("SELECT count(*) FROM admission.commands WHERE run_id = $1", run_id) == 0
    )


async def test_a_cancel_during_a_command_waits_for_its_outcome_and_schedules_nothing_more(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection, crm: httpx.Client, host: Host
) -> None:
    crm.post("/_control/mode", json={"mode": "slow", "delay_s": 3.0, "count": 1})
    started = api.post("/runs", json=BODY, headers={**auth(stack), **key()})
    run_id = started.json()["run_id"]
    with anyio.fail_after(20):  # the note is being written (admitted, dispatched)
        while (
            await db.fetchval("SELECT state FROM admission.commands WHERE run_id = $1", run_id)
            != "dispatching"
        ):
            await anyio.sleep(0.05)
    # Over NATS this time, as a host that holds no HTTP client would.
    request_id = f"cancel-{uuid.uuid4().hex[:12]}"
    await host.js.publish(
        cancel("acme"),
        msgspec.json.encode(
            CancelRun(
                request_id=request_id,
                token=stack.token("acme", "alice@acme.example"),
                run_id=run_id,
            )
        ),
        headers={"Nats-Msg-Id": request_id},
    )
    result = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert (result["status"], result["error"]["code"]) == ("cancelled", "CANCELLED"), result
    [action] = result["actions"]
    assert (action["action"], action["state"]) == ("crm.note.create", "succeeded")
    assert len(notes_for(crm, f"acme:{action['operation_id']}")) == 1
    steps = await _steps(db, run_id)
    assert steps[-1][0] == "observation"  # the outcome observed, no decision after it
    assert ("decision", "answer_directly") not in steps
    # The host's stream carries the same result.
    over_nats = await host.wait_result(started.json()["request_id"], status="cancelled")
    assert over_nats.run_id == run_id


async def test_a_cancel_after_the_end_changes_nothing_and_is_idempotent(
    stack: Stack, api: httpx.Client, db: asyncpg.Connection
) -> None:
    started = api.post("/runs", json=BODY, headers={**auth(stack), **key()})
    run_id = started.json()["run_id"]
    assert api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()["status"] == "succeeded"
    headers = {**auth(stack), **key()}
    first = api.post(f"/runs/{run_id}/cancel", headers=headers)
    again = api.post(f"/runs/{run_id}/cancel", headers=headers)
    other = api.post(f"/runs/{run_id}/cancel", headers={**auth(stack), **key()})
    assert first.status_code == again.status_code == other.status_code == 202
    assert again.json() == first.json()
    with anyio.fail_after(10):
        while not await db.fetchval(
            "SELECT count(*) FROM planner.cancellations WHERE run_id = $1", run_id
        ):
            await anyio.sleep(0.05)
    view = api.get(f"/runs/{run_id}", headers=auth(stack)).json()
    assert view["status"] == "succeeded"
    # Another tenant cannot cancel it: its cancellation names no run of its own.
    api.post(
        f"/runs/{run_id}/cancel", headers={**auth(stack, "globex", "bob@globex.example"), **key()}
    )
    assert api.get(f"/runs/{run_id}", headers=auth(stack)).json()["status"] == "succeeded"
