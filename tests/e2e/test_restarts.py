"""NATS and Postgres killed (SIGKILL) and restarted mid-flow (the fault suite).

Each case gets a fresh deployment. The last one restarts NATS, lets the deployment recover,
submits more and then kills Postgres: it once lost commands, because the tests' Postgres ran
with `synchronous_commit` off and a killed server forgot commits whose dispatch messages were
already on the bus. Writ's pools now set it on for their own sessions, whatever the server says.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from libs.embedded import EmbeddedNats, EmbeddedPostgres
from schemas.host import SubmitCommand
from tests.e2e.conftest import Host, notes_for
from writ.stack import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
def stack() -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="writ-restarts-") as home:
        deployment = Stack(
            Path(home),
            database="restarts",
            durable_pg=False,
            extra_env={
                "*": {"WRIT_DRAIN_TIMEOUT_S": "2"},
                "dispatcher": {
                    "WRIT_LEASE_S": "3",
                    "WRIT_SWEEP_EVERY_S": "1",
                    "WRIT_PENDING_GRACE_S": "5",
                },
            },
        )
        try:
            deployment.start_all()
            yield deployment
        finally:
            deployment.stop()


async def _crash_and_restart(server: EmbeddedNats | EmbeddedPostgres | None) -> None:
    assert server is not None
    server.stop(kill=True)  # SIGKILL: a crash, not a shutdown
    await anyio.sleep(1.0)
    server.start()


async def _all_succeed_once(host: Host, crm: httpx.Client, commands: list[SubmitCommand]) -> None:
    # Generous: every pooled connection fails once and its message backs off before retrying.
    results = [await host.wait_command(c.request_id, timeout=120) for c in commands]
    assert {r.status for r in results} == {"succeeded"}
    for result in results:
        assert len(notes_for(crm, f"acme:{result.operation_id}")) == 1


@pytest.mark.parametrize(
    "servers", [["nats"], ["postgres"], ["nats", "postgres"]], ids="-then-".join
)
async def test_a_server_restarted_mid_flow_loses_nothing(
    stack: Stack, host: Host, crm: httpx.Client, servers: list[str]
) -> None:
    for server in servers:
        commands = [host.command() for _ in range(10)]
        for command in commands:
            await host.submit(command)
        await _crash_and_restart(stack.embedded_nats if server == "nats" else stack.embedded_pg)
        await _all_succeed_once(host, crm, commands)
