"""An outage longer than the outage limit ends in the dead-letter stream saying so, and pages.

This module runs its own deployment (its own nats-server and PostgreSQL) with the outage limit
shortened (`WRIT_OUTAGE_LIMIT_S`, 12 s) and the backoff capped at 1 s, so `max_deliver` (10)
is passed about 8 s into an outage. It stops governance for longer than the limit while a host
sends a command and a run request, and checks the path `WritOutageLimitReached` reads: each
delivery is handled past the limit and dead-lettered as `outage_exhausted` ("still
unavailable after ..."), never as a poison message (`exhausted`), on the real services'
`/metrics` and in `WRIT_DLQ`. Once governance is back the deployment serves again.

The same outage holds an HTTP caller's command waiting for governance: a SIGTERM to ingress then
answers the caller within the server's graceful shutdown (a problem saying to ask again with the
same Idempotency-Key), rather than closing the connection on it.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Host
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

OUTAGE_LIMIT_S = 12.0
BACKOFF_MAX_S = 1.0


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-outage-limit-") as home:
        deployment = Stack(
            Path(home),
            database="outage_limit",
            durable_pg=False,
            extra_env={
                "*": {
                    "WRIT_DRAIN_TIMEOUT_S": "2",
                    "WRIT_RETRY_BACKOFF_MAX_S": str(BACKOFF_MAX_S),
                    "WRIT_OUTAGE_LIMIT_S": str(OUTAGE_LIMIT_S),
                }
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


async def dead_letters(host: Host, since: int) -> dict[str, str]:
    """The reason of each dead letter stored after stream sequence `since`, by its consumer."""
    info = await host.js.stream_info("WRIT_DLQ")
    found = {}
    for seq in range(since + 1, info.state.last_seq + 1):
        msg = await host.js.get_msg("WRIT_DLQ", seq)
        headers = msg.headers or {}
        consumer = headers["Nats-Msg-Id"].split(":")[1]  # dlq:<consumer>:<stream seq>
        found[consumer] = headers["Writ-Dlq-Reason"]
    return found


def failed(stack: Stack, service: str) -> dict[str, float]:
    """`writ_messages_failed_total` of `service`, by outcome (every outcome exported from 0)."""
    page = httpx.get(f"http://127.0.0.1:{stack.metrics_port(service)}/metrics", timeout=5)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            if sample.name == "writ_messages_failed_total":
                assert sample.labels["service"] == service
                outcome = sample.labels["outcome"]
                out[outcome] = out.get(outcome, 0.0) + sample.value
    return out


@pytest.mark.timeout(300)
async def test_an_outage_past_the_limit_is_dead_lettered_as_one_and_counted(
    stack: Stack, host: Host
) -> None:
    since = (await host.js.stream_info("WRIT_DLQ")).state.last_seq
    assert failed(stack, "admission")["outage_exhausted"] == 0  # exported before the first
    stack.stop_process("governance", kill=True)
    command = host.command()
    await host.submit(command)  # admission asks governance to decide it
    request = host.request()
    await host.publish(request, msg_id=request.request_id)  # ingress registers it with governance

    # Each waits: ten deliveries in the first 8 s, then one a second until the limit.
    with anyio.fail_after(OUTAGE_LIMIT_S + 60):
        while len(letters := await dead_letters(host, since)) < 2:
            await anyio.sleep(0.5)
    assert set(letters) == {"admission", "ingress-runs"}, letters
    for consumer, reason in letters.items():
        assert reason.startswith("still unavailable after"), (consumer, reason)
        seconds = float(reason.split()[3])
        assert OUTAGE_LIMIT_S <= seconds < OUTAGE_LIMIT_S + 30, (consumer, reason)

    # What WritOutageLimitReached reads: the outage's outcome, not a poison message's.
    for service in ("admission", "ingress"):
        outcomes = failed(stack, service)
        assert outcomes["outage_exhausted"] == 1, (service, outcomes)
        assert outcomes["exhausted"] == 0, (service, outcomes)

    # Back, governance decides what comes next; nothing more is dead-lettered.
    stack.start_instance("governance", "governance")
    await stack.wait_ready(("governance",))
    after = host.command()
    await host.submit(after)
    result = await host.wait_command(after.request_id, timeout=60)
    assert result.status == "succeeded", result
    assert set(await dead_letters(host, since)) == {"admission", "ingress-runs"}


@pytest.mark.timeout(240)
async def test_a_stopping_ingress_answers_the_caller_it_holds(stack: Stack, host: Host) -> None:
    stack.stop_process("governance", kill=True)
    operation_key = f"op-{uuid.uuid4().hex[:12]}"
    body = {
        "agent": "crm-assistant",
        "operation_key": operation_key,
        "action": "crm.note.create",
        "arguments": {"customer_id": "ACME-42", "body": "Called back about order 7781."},
    }
    headers = {
        "Authorization": f"Bearer {stack.token('acme', 'alice@acme.example')}",
        "Idempotency-Key": f"drain-{uuid.uuid4().hex[:12]}",
    }
    answered: list[Any] = []

    async def submit(client: httpx.AsyncClient) -> None:
        try:
            answered.append(await client.post("/commands", json=body, headers=headers))
        except httpx.HTTPError as exc:  # the connection closed on the caller
            answered.append(exc)

    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(submit, client)
            await anyio.sleep(3)  # handed on: admission waits on governance, the caller on it
            assert not answered, answered
            stopping = time.monotonic()
            code = await anyio.to_thread.run_sync(stack.stop_process, "ingress")
    assert code == 0
    (response,) = answered
    assert isinstance(response, httpx.Response), repr(response)
    assert response.status_code == 504, response.text
    assert response.json()["code"] == "TIMEOUT"
    assert time.monotonic() - stopping < 20

    # Asked again under the same key once both are back, the command is done once.
    stack.start_instance("governance", "governance")
    stack.start_instance("ingress", "ingress")
    await stack.wait_ready(("governance", "ingress"))
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=40) as client:
        again = await client.post("/commands", json=body, headers=headers)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "succeeded", again.text
