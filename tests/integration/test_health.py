"""`/livez` and `/readyz` against real NATS and PostgreSQL, stopped and started under them.

While PostgreSQL is down the actor fetches nothing: the messages published meanwhile stay
undelivered, none is dead-lettered, and all are handled once it is back.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import asyncpg
import nats
import pytest
from nats.js.api import StreamConfig
from prometheus_client import CollectorRegistry

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, ensure_consumer
from libs.db import connect_pool
from libs.embedded import EmbeddedNats, EmbeddedPostgres
from libs.health import Health
from libs.telemetry import ActorMetrics, MetricsServer
from schemas.subjects import dead_letter

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def own_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this module's own: the tests stop it."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("health-pg"), durable=False)
    server.start()
    yield server
    server.stop()


def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _until(port: int, path: str, status: int, *, timeout: float = 20.0) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            code, body = await anyio.to_thread.run_sync(_probe, port, path)
            if code == status:
                return body
            await anyio.sleep(0.1)


class _Deployment:
    """One actor, its health checks and its probe server, as `libs.runtime.serve` wires them."""

    def __init__(self, nc: Any, pool: asyncpg.Pool, unique: str) -> None:
        self.js = nc.jetstream()
        self.stream, self.subject = f"H_{unique}", f"health.{unique}"
        self.spec = ConsumerSpec(
            stream=self.stream,
            durable=f"health-{unique}",
            filter_subjects=(self.subject,),
            ack_wait_s=2.0,
            max_deliver=3,
        )
        self.pool = pool
        self.health = Health(nc=nc, js=self.js, every_s=0.2, timeout_s=1.0, stale_s=5.0)
        self.health.watch_pool("postgres", pool)
        self.registry = CollectorRegistry()
        self.metrics = ActorMetrics(service="health", registry=self.registry)
        self.server = MetricsServer(
            registry=self.registry, host="127.0.0.1", port=0, health=self.health
        )
        self.stopping = anyio.Event()

    async def setup(self) -> None:
        await self.js.add_stream(StreamConfig(name=self.stream, subjects=[self.subject]))
        await self.js.add_stream(
            StreamConfig(name=f"{self.stream}_DLQ", subjects=[dead_letter(self.spec.durable)])
        )
        await ensure_consumer(self.js, self.spec)  # provisioning's part (libs/provision.py)
        await self.pool.execute("CREATE TABLE IF NOT EXISTS handled (n int PRIMARY KEY)")

    async def handle(self, delivery: Delivery[Any]) -> None:
        await self.pool.execute(
            "INSERT INTO handled VALUES ($1) ON CONFLICT DO NOTHING", int(delivery.message)
        )

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(self.health.run)
            await tg.start(
                lambda task_status: run_actor(
                    js=self.js,
                    spec=self.spec,
                    decoder=None,
                    handler=self.handle,
                    metrics=self.metrics,
                    stopping=self.stopping,
                    health=self.health,
                    lag_every_s=0.5,
                    task_status=task_status,
                )
            )
            self.server.start()
            task_status.started()

    async def dead_letters(self) -> int:
        info = await self.js.stream_info(f"{self.stream}_DLQ")
        return int(info.state.messages)


@pytest.fixture
async def nc_private(private_nats: EmbeddedNats) -> AsyncIterator[Any]:
    client = await nats.connect(
        private_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    yield client
    await client.close()


async def test_postgres_outage_stops_fetching_and_nothing_is_dead_lettered(
    own_pg: EmbeddedPostgres, nc_private: Any, unique: str
) -> None:
    pool = await connect_pool(own_pg.admin_url, min_size=1, max_size=4)
    deployment = _Deployment(nc_private, pool, unique)
    await deployment.setup()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(deployment.run)
            port = deployment.server.port
            await _until(port, "/readyz", 200)
            await deployment.js.publish(deployment.subject, b"0")
            with anyio.fail_after(10):
                while not await pool.fetchval("SELECT count(*) FROM handled"):
                    await anyio.sleep(0.05)

            own_pg.stop()
            body = await _until(port, "/readyz", 503)
            assert "postgres" in body["checks"], body
            # Liveness never depends on PostgreSQL: no restart for an outage.
            assert _probe(port, "/livez")[0] == 200
            # A pull request sent before the check failed may still be answered for up to its
            # 1 s expiry; from then on the loop waits at the gate and pulls nothing.
            await anyio.sleep(1.5)
            for n in range(1, 6):
                await deployment.js.publish(deployment.subject, str(n).encode())
            # Long enough for many fetch rounds and for nak backoffs to come due.
            await anyio.sleep(3.0)
            info = await deployment.js.consumer_info(deployment.stream, deployment.spec.durable)
            assert info.num_pending == 5, "the actor fetched while PostgreSQL was down"
            assert info.num_ack_pending == 0 and info.num_redelivered == 0
            assert await deployment.dead_letters() == 0
            assert _probe(port, "/livez")[0] == 200

            own_pg.start()
            await _until(port, "/readyz", 200, timeout=30)
            with anyio.fail_after(20):
                while await pool.fetchval("SELECT count(*) FROM handled") < 6:
                    await anyio.sleep(0.1)
            assert await deployment.dead_letters() == 0
            deployment.stopping.set()
            deployment.server.stop()
            tg.cancel_scope.cancel()
    finally:
        with anyio.move_on_after(5):
            await pool.close()


async def test_nats_outage_fails_readiness_until_it_returns(
    own_pg: EmbeddedPostgres, private_nats: EmbeddedNats, nc_private: Any, unique: str
) -> None:
    pool = await connect_pool(own_pg.admin_url, min_size=1, max_size=2)
    deployment = _Deployment(nc_private, pool, unique)
    await deployment.setup()
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(deployment.run)
            port = deployment.server.port
            await _until(port, "/readyz", 200)
            private_nats.stop()
            body = await _until(port, "/readyz", 503)
            assert "nats" in body["checks"], body
            assert _probe(port, "/livez")[0] == 200
            private_nats.start()
            await _until(port, "/readyz", 200, timeout=30)
            deployment.stopping.set()
            deployment.server.stop()
            tg.cancel_scope.cancel()
    finally:
        await pool.close()


async def test_a_draining_process_is_not_ready_but_live() -> None:
    health = Health(every_s=0.1, stale_s=5.0)
    await health.check()
    assert health.ready()[0]
    health.stopping()
    ok, checks = health.ready()
    assert not ok and checks == {"process": "stopping"}
    assert health.live()[0]


async def test_a_stuck_fetch_loop_fails_liveness() -> None:
    health = Health(every_s=0.1, stale_s=0.2)
    health.consumer_bound("S", "stuck")
    await health.check()
    assert health.live()[0]
    await anyio.sleep(0.3)
    await health.check()  # the event loop beats; the fetch loop did not
    ok, checks = health.live()
    assert not ok and list(checks) == ["stuck"], checks
    health.loop_ended("stuck")
    assert health.live()[0]
    assert health.ready() == (False, {"consumer stuck": "not bound"})


async def test_a_busy_pool_is_not_a_dead_database(own_pg: EmbeddedPostgres) -> None:
    pool = await connect_pool(own_pg.admin_url, min_size=1, max_size=2)
    try:
        health = Health(every_s=0.1, timeout_s=0.5)
        health.watch_pool("postgres", pool)
        async with pool.acquire(), pool.acquire():  # every connection out, as under load
            await health.check()
            assert health.dependencies_ok and health.ready()[0], health.ready()
        await health.check()
        assert health.ready()[0]
    finally:
        await pool.close()
