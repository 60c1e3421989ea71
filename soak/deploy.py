"""The soak's deployment: `writ run`'s stack (embedded NATS and PostgreSQL, the fakes, the six
services), a second dispatcher and a second admission (whose outbox relay runs beside the
first's), short leases so a frozen holder is taken over within seconds, and `writ run`'s own
supervisor, which restarts every service process the nemesis kills."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Final

import anyio
import nats

from libs.natsauth import ADMIN
from soak.settings import SoakSettings
from writ.stack import SERVICES, Stack
from writ.supervisor import Supervisor

__all__ = ["FAKES", "REPLICAS", "Deployment", "admin_connect"]

# The second instance of each service that runs twice (the name is the instance's key).
REPLICAS: Final = {"dispatcher-2": "dispatcher", "admission-2": "admission"}
FAKES: Final = ("crm", "payments")
# A provider call's timeout: a `slow` fault longer than this is an answer lost to the caller.
CALL_TIMEOUT_S: Final = 1.5


async def admin_connect(stack: Stack, **options: Any) -> nats.aio.client.Client:
    """The administrator's connection, credentials as options: a URL's own user and password
    would not go with the other cluster nodes the servers tell the client about."""
    return await nats.connect(stack.public_nats_url, user=ADMIN,
                              password=stack.nats_password(ADMIN), **options)


class Deployment:
    """A `Stack` with replicas and a supervisor, and a log of what happened to it."""

    def __init__(self, settings: SoakSettings, home: Path) -> None:
        self.settings = settings
        self.home = home
        self.events = (home / "soak-events.log").open("a", buffering=1)
        env = {
            "*": {"WRIT_DRAIN_TIMEOUT_S": "2"},
            "dispatcher": {"WRIT_LEASE_S": str(settings.lease_s), "WRIT_SWEEP_EVERY_S": "1",
                           "WRIT_PENDING_GRACE_S": "10",
                           "WRIT_CALL_TIMEOUT_S": str(CALL_TIMEOUT_S)},
        }
        nats_factory = None
        if settings.topology == "cluster":
            from soak.cluster import NatsCluster

            env["*"]["WRIT_STREAM_REPLICAS"] = "3"
            nats_factory = NatsCluster
        self.stack = Stack(home / "stack", database="soak", durable_pg=settings.durable_pg,
                           extra_env=env, nats_factory=nats_factory)
        self.supervisor = Supervisor(self.stack, report=self.log, max_delay_s=5.0)

    def log(self, kind: str, message: str) -> None:
        """One line in `soak-events.log` (and on stderr)."""
        line = f"{time.strftime('%H:%M:%S')} {kind:<10} {message}"
        self.events.write(line + "\n")
        print(line, file=sys.stderr, flush=True)

    @property
    def service_instances(self) -> dict[str, str]:
        """Every service instance the nemesis may kill: key -> service."""
        return {**{name: name for name in SERVICES}, **REPLICAS}

    def start(self) -> None:
        """Everything up and ready, then supervised."""
        self.stack.start_all()
        for key, service in REPLICAS.items():
            self.stack.start_instance(service, key)
        anyio.run(self.stack.wait_ready)
        self.supervisor.start()

    async def all_up(self, timeout: float = 60) -> None:
        """Until every instance runs again (the supervisor restarts the killed ones) and each
        service answers its ping."""
        with anyio.fail_after(timeout):
            while True:
                down = [key for key in self.service_instances
                        if (proc := self.stack.procs.get(key)) is None or proc.poll() is not None]
                if not down:
                    break
                await anyio.sleep(0.2)
        await self.stack.wait_ready(timeout=timeout)

    def stop(self) -> None:
        """Stop supervising, then stop everything."""
        self.supervisor.stop()
        self.stack.stop()
        self.events.close()
