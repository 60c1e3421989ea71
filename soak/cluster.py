"""The production topology on one machine: three nats-server processes from the same wheel,
routes on loopback, JetStream on each (`sync_interval: always`), Writ's streams at three
replicas (`WRIT_STREAM_REPLICAS=3`, set by the deployment). The nemesis faults one node at a
time, so a majority is always up: nothing may be lost.

`NatsCluster` stands where `Stack` puts an `EmbeddedNats` (`url`, `start`, `stop`): clients
are given node 0's URL and learn the others from the servers' gossip (a client connected
before node 0 went down reconnects to another; a process started while it is down fails and
is restarted by the supervisor until it is back).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import anyio
import httpx

from libs.embedded import EmbeddedNats, free_port

__all__ = ["NODES", "NatsCluster"]

NODES = 3


class NatsCluster:
    """Three routed nats-server nodes under one folder, faulted one at a time."""

    def __init__(self, data_dir: Path, *, auth: str = "") -> None:
        self.data_dir = Path(data_dir)
        cluster_ports = [free_port() for _ in range(NODES)]
        self.monitor_ports = [free_port() for _ in range(NODES)]
        routes = ", ".join(f'"nats://127.0.0.1:{p}"' for p in cluster_ports)
        self.nodes = [
            EmbeddedNats(
                self.data_dir / f"n{i}",
                auth=auth,
                server_name=f"writ-n{i}",
                extra_conf=(
                    f'http: "127.0.0.1:{self.monitor_ports[i]}"\n'
                    'cluster {\n  name: "writ"\n'
                    f'  listen: "127.0.0.1:{cluster_ports[i]}"\n'
                    f"  routes: [{routes}]\n}}\n"
                ),
            )
            for i in range(NODES)
        ]
        self._busy = threading.Lock()  # one node faulted at a time
        self._frozen: set[int] = set()

    @property
    def url(self) -> str:
        """Node 0's client URL (the others are learned from the servers)."""
        return self.nodes[0].url

    def start(self) -> None:
        """Every node up (those already running are left alone), JetStream ready on each."""
        for i in list(self._frozen):
            self._thaw(i)
        for node in self.nodes:
            node.start()
        self._wait_healthy(range(NODES))

    def stop(self, kill: bool = False) -> None:
        """Every node down."""
        for i in list(self._frozen):
            self._thaw(i)
        for node in self.nodes:
            node.stop(kill=kill)

    def heal(self) -> None:
        """Thaw a frozen node and start a stopped one."""
        self.start()

    def _wait_healthy(self, nodes: range | list[int], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for i in nodes:
            url = f"http://127.0.0.1:{self.monitor_ports[i]}/healthz"
            while True:
                try:
                    if httpx.get(url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"NATS node {i} not healthy within {timeout}s")
                time.sleep(0.2)

    def serving(self, client: str) -> int | None:
        """The node a client (by its connection name, `writ-<service>`) is connected to."""
        for i, port in enumerate(self.monitor_ports):
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/connz?limit=4096", timeout=2)
                connections = answer.json().get("connections") or []
            except (httpx.HTTPError, ValueError):
                continue  # that node is down: the client is on another
            if any(c.get("name") == client for c in connections):
                return i
        return None

    def index(self, server_name: str) -> int:
        """A node's index from its server name (`writ-n<i>`)."""
        return int(server_name.removeprefix("writ-n"))

    def _thaw(self, i: int) -> None:
        self._frozen.discard(i)
        pid = self.nodes[i].pid
        if pid is not None:
            os.kill(pid, signal.SIGCONT)

    async def fault(self, kind: str, node: int, hold_s: float) -> str:
        """Kill, freeze or restart node `node` for `hold_s`; refused (a note says why) while
        another node is faulted, so two are always up."""
        if not self._busy.acquire(blocking=False):
            return "skipped: another node is faulted"
        try:
            target = self.nodes[node]
            if kind == "node_kill":
                await anyio.to_thread.run_sync(lambda: target.stop(kill=True))
                await anyio.sleep(hold_s)
                await anyio.to_thread.run_sync(target.start)
            elif kind == "node_freeze":
                pid = target.pid
                if pid is None:
                    return "skipped: not running"
                os.kill(pid, signal.SIGSTOP)
                self._frozen.add(node)
                try:
                    await anyio.sleep(hold_s)
                finally:
                    self._thaw(node)
            else:  # node_restart: a graceful stop, as a rolling upgrade does
                await anyio.to_thread.run_sync(target.stop)
                await anyio.to_thread.run_sync(target.start)
            await anyio.to_thread.run_sync(self._wait_healthy, [node])
            return f"node writ-n{node}"
        finally:
            self._busy.release()
