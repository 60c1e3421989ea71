"""The nemesis: a seeded random schedule of faults, printed before the load starts so a failure
can be replayed (`SOAK_SEED`), then applied to the running deployment.

Every 20-60 s (`SOAK_FAULT_EVERY`) one of: `kill -9` of a service instance (the supervisor
brings it back), `SIGSTOP` of one and `SIGCONT` after longer than a lease (another instance
takes its commands over; the frozen one, thawed, must be fenced), a restart of NATS (in the
cluster topology: one node, by SIGKILL, SIGSTOP or restart, the streams' leader included) or
of PostgreSQL (SIGKILL of the postmaster), or a provider fault for a while: the CRM or the
payment provider losing its answer after the effect, failing with a 5xx, or answering slower
than the dispatcher waits.

On the cluster a second draw from the same seed (its own generator, so the first draw, and
every seed's schedule of the faults above, is unchanged) adds leader faults at times of their
own, every 1.5x `SOAK_FAULT_EVERY`: `stepdown` (the administrator moves a stream's leader,
`$JS.API.STREAM.LEADER.STEPDOWN.<stream>`, or a consumer's, `target` `<stream>/<consumer>`),
and `kill -9` or `SIGSTOP` of `dispatcher`, the node a dispatcher is connected to.
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

import anyio
import httpx

from libs.bus import until_answered
from schemas import subjects
from soak.deploy import CALL_TIMEOUT_S, MODEL_TIMEOUT_S, Deployment, admin_connect

__all__ = ["Fault", "Nemesis", "schedule"]

PROVIDER_MODES: Final = ("lose_response", "fail", "slow")
PROVIDERS: Final = ("crm", "payments", "llm")  # llm: the fake model the planner asks
_KINDS: Final = (("kill", 5), ("freeze", 3), ("nats", 2), ("postgres", 1), ("provider", 3))
# On a cluster a whole-NATS restart gives way to faults of one node at a time (a majority up).
_CLUSTER_KINDS: Final = (("node_kill", 2), ("node_freeze", 1), ("node_restart", 1))
# The leaders the second draw moves: the streams commands and internal events travel on, and
# the consumers of the dispatcher and the planner.
_LEADERS: Final = ("WRIT_CMD", "WRIT_INT", "WRIT_CMD/dispatcher", "WRIT_INT/planner")


@dataclass(frozen=True)
class Fault:
    """One fault: when (seconds after the load starts), what, and on whom."""

    at_s: float
    kind: str  # kill | freeze | nats | postgres | provider | node_kill | node_freeze | ...
    target: str = ""  # a service instance, a provider, a node ("leader": the stream leader)
    mode: str = ""  # a provider's fault mode
    hold_s: float = 0.0  # how long a freeze, an outage or a provider fault lasts

    def describe(self) -> str:
        what = {
            "kill": f"kill -9 {self.target}",
            "freeze": f"SIGSTOP {self.target} for {self.hold_s:.1f}s",
            "nats": f"restart NATS (down {self.hold_s:.1f}s)",
            "postgres": f"kill -9 PostgreSQL (down {self.hold_s:.1f}s)",
            "provider": f"{self.target} {self.mode} for {self.hold_s:.1f}s",
            "node_kill": f"kill -9 NATS node {self.target} (down {self.hold_s:.1f}s)",
            "node_freeze": f"SIGSTOP NATS node {self.target} for {self.hold_s:.1f}s",
            "node_restart": f"restart NATS node {self.target}",
            "stepdown": f"move the leader of {self.target}",
        }[self.kind]
        return f"t+{self.at_s:6.1f}s  {what}"


def schedule(
    seed: int,
    *,
    duration_s: float,
    every: tuple[float, float],
    lease_s: float,
    instances: list[str],
    cluster: bool,
) -> list[Fault]:
    """The faults of a soak, from its seed alone (the same seed, the same faults)."""
    rng = random.Random(seed)
    kinds = (
        [k for k in _KINDS if k[0] != "nats"] + list(_CLUSTER_KINDS) if cluster else list(_KINDS)
    )
    names, weights = [k for k, _ in kinds], [w for _, w in kinds]
    faults, at = [], rng.uniform(*every)
    while at < duration_s:
        kind = rng.choices(names, weights)[0]
        if kind == "kill":
            fault = Fault(at, kind, rng.choice(instances))
        elif kind == "freeze":
            fault = Fault(
                at, kind, rng.choice(instances), hold_s=round(lease_s + rng.uniform(1.0, 6.0), 1)
            )
        elif kind in ("nats", "postgres"):
            fault = Fault(at, kind, hold_s=round(rng.uniform(0.5, 4.0), 1))
        elif kind == "provider":
            fault = Fault(
                at,
                kind,
                rng.choice(PROVIDERS),
                rng.choice(PROVIDER_MODES),
                hold_s=round(rng.uniform(3.0, 15.0), 1),
            )
        else:
            node = rng.choice(("leader", "0", "1", "2"))
            fault = Fault(at, kind, node, hold_s=round(rng.uniform(1.0, 8.0), 1))
        faults.append(fault)
        at += rng.uniform(*every)
    if cluster:
        faults = sorted(faults + _leader_faults(seed, duration_s, every), key=lambda f: f.at_s)
    return faults


def _leader_faults(seed: int, duration_s: float, every: tuple[float, float]) -> list[Fault]:
    """The cluster's leader faults: a leader moved, or the dispatcher's node killed or frozen."""
    rng = random.Random(f"{seed}:leaders")
    slower = (every[0] * 1.5, every[1] * 1.5)
    faults, at = [], rng.uniform(*slower)
    while at < duration_s:
        kind = rng.choice(("stepdown", "stepdown", "node_kill", "node_freeze"))
        if kind == "stepdown":
            faults.append(Fault(at, kind, rng.choice(_LEADERS)))
        else:
            faults.append(Fault(at, kind, "dispatcher", hold_s=round(rng.uniform(1.0, 8.0), 1)))
        at += rng.uniform(*slower)
    return faults


class Nemesis:
    """Applies a schedule to a deployment, and heals whatever is still broken at the end."""

    def __init__(self, deployment: Deployment, faults: list[Fault]) -> None:
        self.deployment, self.faults = deployment, faults
        self.applied: list[dict[str, Any]] = []
        self._frozen: set[int] = set()
        self._faulty: set[str] = set()  # providers in a fault mode

    async def run(self, started: float) -> None:
        """Each fault at its time (the load runs meanwhile)."""
        async with anyio.create_task_group() as tg:
            for fault in self.faults:
                delay = started + fault.at_s - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(self._apply, fault)

    async def _apply(self, fault: Fault) -> None:
        log = self.deployment.log
        stack = self.deployment.stack
        record = {**asdict(fault), "ok": True, "note": ""}
        log("nemesis", fault.describe())
        try:
            if fault.kind in ("kill", "freeze"):
                proc = stack.procs.get(fault.target)
                if proc is None or proc.poll() is not None:
                    record.update(ok=False, note="not running (restarting)")
                elif fault.kind == "kill":
                    os.kill(proc.pid, signal.SIGKILL)
                else:
                    await self._freeze(proc.pid, fault.hold_s)
            elif fault.kind == "nats":
                assert stack.embedded_nats is not None
                nats_server = stack.embedded_nats
                await anyio.to_thread.run_sync(lambda: nats_server.stop(kill=True))
                await anyio.sleep(fault.hold_s)
                await anyio.to_thread.run_sync(stack.embedded_nats.start)
            elif fault.kind == "postgres":
                assert stack.embedded_pg is not None
                pg = stack.embedded_pg
                await anyio.to_thread.run_sync(lambda: pg.stop(kill=True))
                await anyio.sleep(fault.hold_s)
                await anyio.to_thread.run_sync(stack.embedded_pg.start)
            elif fault.kind == "provider":
                await self._provider(fault)
            elif fault.kind == "stepdown":
                record["note"] = await self._stepdown(fault.target)
            else:
                cluster: Any = stack.embedded_nats
                node = await self._node(cluster, fault.target)
                record["note"] = await cluster.fault(fault.kind, node, fault.hold_s)
                record["ok"] = not record["note"].startswith("skipped")
        except Exception as exc:  # a fault that could not be applied is reported, not fatal
            record.update(ok=False, note=repr(exc)[:300])
            log("nemesis", f"could not apply {fault.describe()}: {exc!r}")
        self.applied.append(record)

    async def _stepdown(self, target: str) -> str:
        """Ask a stream's leader (`target` a stream) or a consumer's (`<stream>/<consumer>`) to
        step down, as an administrator; the new leader's name."""
        stream, _, consumer = target.partition("/")
        nc = await admin_connect(self.deployment.stack, connect_timeout=5, max_reconnect_attempts=2)
        try:
            js = nc.jetstream()

            async def leader() -> str | None:
                info: Any = await (
                    js.consumer_info(stream, consumer) if consumer else js.stream_info(stream)
                )
                return info.cluster.leader if info.cluster else None

            before = await until_answered(leader, what=f"the leader of {target}")
            api = (
                f"CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"
                if consumer
                else (f"STREAM.LEADER.STEPDOWN.{stream}")
            )
            reply = await nc.request(f"$JS.API.{api}", b"", timeout=10)
            if b'"success":true' not in reply.data.replace(b" ", b""):
                raise RuntimeError(f"stepdown refused: {reply.data[:200]!r}")
            for _ in range(100):  # until another leader is elected
                try:
                    after = await leader()
                except Exception:  # electing: no answer yet
                    after = None
                if after and after != before:
                    return f"leader {before} -> {after}"
                await anyio.sleep(0.2)
            return "leader unchanged after 20 s"
        finally:
            await nc.close()

    async def _node(self, cluster: Any, target: str) -> int:
        """A node's index; "leader" is the leader of the stream the commands travel on,
        "dispatcher" the node a dispatcher is connected to."""
        if target == "dispatcher":
            node = await anyio.to_thread.run_sync(cluster.serving, "writ-dispatcher")
            return 0 if node is None else node
        if target != "leader":
            return int(target)
        nc = await admin_connect(self.deployment.stack, connect_timeout=5, max_reconnect_attempts=2)
        try:
            js = nc.jetstream()
            # Right after another node fault the stream may be electing: asked again until it
            # answers.
            name = await until_answered(
                lambda: js.find_stream_name_by_subject(subjects.command("acme")),
                what="the commands' stream",
            )
            stream = await until_answered(lambda: js.stream_info(name), what="its leader")
            leader = stream.cluster.leader if stream.cluster else None
        finally:
            await nc.close()
        return cluster.index(leader) if leader else 0

    async def _freeze(self, pid: int, hold_s: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        self._frozen.add(pid)
        try:
            await anyio.sleep(hold_s)
        finally:
            self._thaw(pid)

    def _thaw(self, pid: int) -> None:
        if pid in self._frozen:
            self._frozen.discard(pid)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    async def _provider(self, fault: Fault) -> None:
        mode: dict[str, Any] = {"mode": fault.mode}
        if fault.mode == "slow":  # past the dispatcher's (the planner's) wait: an answer lost
            mode["delay_s"] = (MODEL_TIMEOUT_S if fault.target == "llm" else CALL_TIMEOUT_S) + 1.5
        async with self._client(fault.target) as client:
            (await client.post("/_control/mode", json=mode)).raise_for_status()
            self._faulty.add(fault.target)
            try:
                await anyio.sleep(fault.hold_s)
            finally:
                with anyio.CancelScope(shield=True):
                    await client.post("/_control/mode", json={"mode": "normal"})
                    self._faulty.discard(fault.target)

    def _client(self, target: str) -> httpx.AsyncClient:
        """The control API of a provider (the model's asks for its token)."""
        stack = self.deployment.stack
        if target == "llm":
            return self.deployment.model_client(timeout=5)
        url = {"crm": stack.crm_url, "payments": stack.payments_url}[target]
        return httpx.AsyncClient(base_url=url, timeout=5)

    def kinds(self) -> dict[str, int]:
        """How many faults of each kind were injected."""
        out: dict[str, int] = {}
        for record in self.applied:
            key = record["kind"] + (f":{record['mode']}" if record["mode"] else "")
            if record["ok"]:
                out[key] = out.get(key, 0) + 1
        return out

    async def heal(self) -> None:
        """Thaw what is frozen, providers back to normal, NATS and PostgreSQL up."""
        for pid in list(self._frozen):
            self._thaw(pid)
        stack = self.deployment.stack
        for target in PROVIDERS:
            async with self._client(target) as client:
                await client.post("/_control/mode", json={"mode": "normal"})
        if stack.embedded_nats is not None:
            heal = getattr(stack.embedded_nats, "heal", None)
            await anyio.to_thread.run_sync(heal or stack.embedded_nats.start)
        if stack.embedded_pg is not None:
            await anyio.to_thread.run_sync(stack.embedded_pg.start)
