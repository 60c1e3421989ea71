"""A tenant onboarded and retired on a running nats-server by configuration reloads, from a
process other than the one that started it (`writ tenant add|remove`, through the server's
pid file): connections made before a reload get the new permissions (ingress binds the new
tenant's consumer on the connection it had), the new host publishes at once, and once
removed its open connection is closed, its password refused and its streams deleted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import nats
import pytest
from nats.aio.client import Client

from libs.embedded import EmbeddedNats
from libs.natsauth import PROVISION, auth_config, ensure_passwords, host_user, inbox_prefix
from libs.provision import bind_consumer, consumers, provision_bus, provision_tenant, retire_tenant
from schemas import subjects
from tests.e2e.hostcreds import nats_answer

pytestmark = pytest.mark.anyio


class Server:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tenants = ["acme"]
        self.nats = EmbeddedNats(folder / "nats", auth=self.auth())

    def auth(self) -> str:
        return auth_config(ensure_passwords(self.folder, self.tenants), self.tenants)

    def url(self, user: str) -> str:
        password = (self.folder / f"nats-{user}.password").read_text().strip()
        return self.nats.url.replace("nats://", f"nats://{user}:{password}@")

    async def connect(self, user: str, **options: object) -> Client:
        return await nats.connect(self.url(user), inbox_prefix=inbox_prefix(user), **options)

    def reload_from_elsewhere(self) -> None:
        """What another process does: the same folder, the running server's pid file."""
        EmbeddedNats(self.nats.data_dir, port=self.nats.port).reload(self.auth())


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    s = Server(tmp_path)
    s.nats.start()
    provisioner = await s.connect(PROVISION)
    await provision_bus(provisioner.jetstream(), s.tenants)
    await provisioner.close()
    try:
        yield s
    finally:
        s.nats.stop()


async def test_a_tenant_is_added_and_removed_by_reloads_of_the_running_server(
    server: Server,
) -> None:
    ingress = await server.connect("ingress")
    provisioner = await server.connect(PROVISION)
    closed = anyio.Event()

    async def on_closed() -> None:
        closed.set()

    try:
        server.tenants.append("initech")
        server.reload_from_elsewhere()
        await provision_tenant(provisioner.jetstream(), "initech")
        # Ingress's connection, made before the tenant existed, reaches its consumer now.
        await bind_consumer(ingress.jetstream(), consumers(["initech"])[-1], patience_s=5)
        host = await server.connect(
            host_user("initech"), allow_reconnect=False, closed_cb=on_closed
        )
        ack = await host.jetstream().publish(subjects.request("initech"), b"{}")
        assert ack.stream == subjects.in_stream("initech")
        url = server.url(host_user("initech"))

        server.tenants.remove("initech")
        server.reload_from_elsewhere()
        with anyio.fail_after(10):
            await closed.wait()  # its open connection is closed by the server
        assert "Authorization Violation" in await nats_answer(url)
        assert await nats_answer(server.url(host_user("acme"))) == "PONG"
        assert await retire_tenant(provisioner.jetstream(), "initech") == [
            subjects.in_stream("initech"),
            subjects.out_stream("initech"),
        ]
        assert await retire_tenant(provisioner.jetstream(), "initech") == []
    finally:
        await provisioner.close()
        await ingress.close()
