"""`/readyz` and `/livez` of the six processes while PostgreSQL is stopped and started again.

What the chart's probes rely on (docs/design.md section 13): a service whose PostgreSQL is gone is
not ready and fetches nothing, so commands submitted meanwhile wait on the bus instead of
burning deliveries into the dead-letter stream; it is still live (no restart); and once
PostgreSQL is back every service is ready again and every command ends once.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import Host, notes_for
from writ.stack import SERVICES, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]
WITH_DATABASE = tuple(s for s in SERVICES if s != "ingress")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-readiness-") as home:
        deployment = Stack(
            Path(home),
            database="readiness",
            durable_pg=False,
            extra_env={"*": {"WRIT_DRAIN_TIMEOUT_S": "2", "WRIT_HEALTH_EVERY_S": "0.5"}},
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _until(port: int, path: str, status: int, timeout: float = 30) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            code, body = await anyio.to_thread.run_sync(_probe, port, path)
            if code == status:
                return body
            await anyio.sleep(0.2)


async def _dead_letters(host: Host) -> int:
    return int((await host.js.stream_info("WRIT_DLQ")).state.messages)


async def test_postgres_stopped_makes_services_unready_and_dead_letters_nothing(
    stack: Stack, host: Host, crm: httpx.Client
) -> None:
    assert stack.embedded_pg is not None
    ports = {name: stack.metrics_port(name) for name in SERVICES}
    for port in ports.values():
        await _until(port, "/readyz", 200)
    before = await _dead_letters(host)

    stack.embedded_pg.stop()
    try:
        for name in WITH_DATABASE:
            body = await _until(ports[name], "/readyz", 503)
            assert "postgres" in body["checks"], (name, body)
        assert _probe(ports["ingress"], "/readyz")[0] == 200  # it has no database
        # The pending pulls of the moment PostgreSQL went (1 s at most) run out first.
        await anyio.sleep(1.5)
        commands = [host.command() for _ in range(5)]
        for command in commands:
            await host.submit(command)
        # Many fetch rounds, and long enough for retry backoffs to have come due.
        await anyio.sleep(6.0)
        assert await _dead_letters(host) == before
        for name, port in ports.items():
            assert _probe(port, "/livez")[0] == 200, name
    finally:
        stack.embedded_pg.start()

    for port in ports.values():
        await _until(port, "/readyz", 200, timeout=60)
    results = [await host.wait_command(c.request_id, timeout=90) for c in commands]
    assert {r.status for r in results} == {"succeeded"}, results
    for result in results:
        assert len(notes_for(crm, f"acme:{result.operation_id}")) == 1
    assert await _dead_letters(host) == before
