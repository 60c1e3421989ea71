"""`wait` waits for news, on both doors: a run's result carries a `version` that grows with
each change a host can see, and `wait` with `after=<version>` answers only a newer result (or
says that none came), never the one the caller already has."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import msgspec
import pytest

from schemas.host_reads import HostRead, host_read
from tests.e2e.conftest import Host
from tests.e2e.test_http_api import auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

APPROVER: dict[str, Any] = {"principal": "ops@acme.example", "roles": ["approver"]}


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=70) as client:
        yield client


async def _nats_wait(
    host: Host, stack: Stack, run_id: str, *, after: int, timeout_s: float
) -> tuple[dict[str, str], dict[str, Any]]:
    """The NATS door's `wait` read, as the host asks it: (error headers, answer)."""
    nc = await host.tenant_nc("acme")
    ask = HostRead(
        token=stack.token("acme", "alice@acme.example"),
        run_id=run_id,
        after=after,
        timeout_s=timeout_s,
    )
    reply = await nc.request(
        host_read("acme", "wait"), msgspec.json.encode(ask), timeout=timeout_s + 20
    )
    headers = dict(reply.headers or {})
    return headers, (
        {} if headers.get("Nats-Service-Error-Code") else msgspec.json.decode(reply.data)
    )


async def test_wait_after_a_version_answers_only_news_on_both_doors(
    stack: Stack, api: httpx.Client, host: Host, db: asyncpg.Connection
) -> None:
    started = api.post(
        "/runs",
        headers={**auth(stack), **key()},
        json={"agent": "review-assistant", "input": "Note the call about order 7781's delay."},
    )
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    stopped = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    assert stopped["status"] == "awaiting_human", stopped
    seen = stopped["version"]
    assert seen >= 1
    assert api.get(f"/runs/{run_id}", headers=auth(stack)).json()["version"] == seen
    errors, over_nats = await _nats_wait(host, stack, run_id, after=-1, timeout_s=10)
    assert errors == {} and (over_nats["status"], over_nats["version"]) == ("awaiting_human", seen)

    # Nothing newer than what was seen: the wait says so, on each door.
    quiet = api.get(
        f"/runs/{run_id}/wait", params={"after": seen, "timeout_s": 1}, headers=auth(stack)
    )
    assert quiet.status_code == 202, quiet.text
    assert (quiet.json()["status"], quiet.json()["version"]) == ("awaiting_human", seen)
    errors, _ = await _nats_wait(host, stack, run_id, after=seen, timeout_s=1)
    assert errors["Nats-Service-Error-Code"] == "504"
    assert errors["Nats-Service-Error"].startswith("TIMEOUT: no result newer than version")

    answered = api.post(
        f"/reviews/{stopped['pending_id']}",
        json={"answer": "approve"},
        headers={**auth(stack, **APPROVER), **key()},
    )
    assert answered.status_code == 200, answered.text
    # Asked at once, while the run may still stand where it stopped: only news comes back.
    news = api.get(
        f"/runs/{run_id}/wait", params={"after": seen, "timeout_s": 60}, headers=auth(stack)
    )
    assert news.status_code == 200, news.text
    assert news.json()["status"] == "succeeded", news.json()
    assert news.json()["version"] > seen
    errors, over_nats = await _nats_wait(host, stack, run_id, after=seen, timeout_s=30)
    assert errors == {}
    assert (over_nats["status"], over_nats["version"]) == ("succeeded", news.json()["version"])
    assert news.json()["version"] == await db.fetchval(
        "SELECT state_version FROM planner.runs WHERE run_id = $1", run_id
    )
    # The result the host's stream holds carries the same version.
    published = await host.results(started.json()["request_id"])
    assert published and {r.version for r in published} >= {seen, news.json()["version"]}
