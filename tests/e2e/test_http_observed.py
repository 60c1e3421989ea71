"""The HTTP door is observed as the NATS door is: its requests, refusals by code, latency per
route, authentication failures and requests in flight on ingress's `/metrics`, with bounded
labels (a route's template, never an id)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_http_api import BODY, auth, key
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

RUNS = "/api/v1/runs"
RUN = "/api/v1/runs/{run_id}"


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=40) as client:
        yield client


def _samples(stack: Stack) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"http://127.0.0.1:{stack.metrics_port('ingress')}/metrics").text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("writ_http_")
    }


def _value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    wanted = {"service": "ingress", **labels}
    return sum(
        v for (n, ls), v in samples.items() if n == name and wanted.items() <= dict(ls).items()
    )


async def test_http_requests_refusals_latency_and_auth_failures_are_counted(
    stack: Stack, api: httpx.Client
) -> None:
    before = _samples(stack)
    started = api.post("/runs", json=BODY, headers={**auth(stack), **key()})
    assert started.status_code == 202, started.text
    run_id = started.json()["run_id"]
    assert api.get(f"/runs/{run_id}/wait", headers=auth(stack)).status_code == 200
    missing = api.get(f"/runs/{uuid.uuid4()}", headers=auth(stack))
    assert missing.status_code == 404
    unsigned = api.get(f"/runs/{run_id}", headers={"Authorization": "Bearer not-a-token"})
    assert unsigned.json()["code"] == "INVALID_TOKEN"
    expired = api.get(f"/runs/{run_id}", headers=auth(stack, ttl_s=-60))
    assert expired.json()["code"] == "TOKEN_EXPIRED"
    after = _samples(stack)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    requests = "writ_http_requests_total"
    assert grew(requests, route=RUNS, method="POST", status="202", code="none") == 1
    assert grew(requests, route=RUN, method="GET", status="404", code="NOT_FOUND") == 1
    assert grew(requests, route=RUN, method="GET", status="401", code="INVALID_TOKEN") == 1
    assert grew(requests, route=RUN, method="GET", status="401", code="TOKEN_EXPIRED") == 1
    assert grew("writ_http_auth_failures_total", code="INVALID_TOKEN") == 1
    assert grew("writ_http_auth_failures_total", code="TOKEN_EXPIRED") == 1
    assert grew("writ_http_request_duration_seconds_count", route=f"{RUN}/wait", method="GET") == 1
    assert _value(after, "writ_http_requests_in_flight") >= 0
    # Bounded labels: a route's template, never a run's id.
    assert not any(run_id in dict(labels).get("route", "") for _, labels in after)


async def test_requests_in_flight_are_counted_while_they_wait(
    stack: Stack, api: httpx.Client
) -> None:
    started = api.post("/runs", json=BODY, headers={**auth(stack), **key()})
    run_id = started.json()["run_id"]
    done = api.get(f"/runs/{run_id}/wait", headers=auth(stack)).json()
    waiting = "writ_http_requests_in_flight"
    idle = _value(_samples(stack), waiting)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40) as client:
        async with anyio.create_task_group() as tg:
            # Nothing newer than the result it has: the wait holds for its timeout.
            tg.start_soon(
                functools.partial(
                    client.get,
                    f"/runs/{run_id}/wait",
                    params={"after": done["version"], "timeout_s": 10},
                    headers=auth(stack),
                )
            )
            with anyio.fail_after(8):
                while _value(_samples(stack), waiting) < idle + 1:
                    await anyio.sleep(0.1)
    # Answered: counted out again (just after the last byte went).
    with anyio.fail_after(5):
        while _value(_samples(stack), waiting) != idle:
            await anyio.sleep(0.1)
