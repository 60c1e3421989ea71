"""Liveness and readiness of a service process: what `/livez` and `/readyz` answer.

- Live: the event loop turns (the check loop beats every `every_s`) and every actor's fetch loop
  goes round (`run_actor` beats each time, also while it waits). Never NATS or PostgreSQL: an
  outage of theirs must not get every pod restarted.
- Ready: NATS connected and not draining, every actor's consumer bound (its info readable) and
  not stalled (messages waiting, none delivered for a while: `libs.stall`), every watched
  PostgreSQL pool answers `SELECT 1`, and the process not stopping.
- While NATS or PostgreSQL fail their checks, actors fetch nothing (`wait_dependencies`), so an
  outage does not burn deliveries up to `max_deliver` into the dead-letter stream. A handler
  that failed calls `suspect()`, which re-runs the checks at once instead of at the next tick.

The checks run on the event loop; the HTTP server (a thread, `libs.telemetry.MetricsServer`)
only reads the results they leave here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import anyio.abc
import asyncpg
from nats.aio.client import Client
from nats.js import JetStreamContext

__all__ = ["Health"]

log = logging.getLogger("writ.health")


class Health:
    """The checks behind `/livez` and `/readyz`, and the gate an actor waits at before fetching."""

    def __init__(
        self,
        *,
        nc: Client | None = None,
        js: JetStreamContext | None = None,
        every_s: float = 2.0,
        timeout_s: float = 2.0,
        stale_s: float = 30.0,
    ) -> None:
        self._nc, self._js = nc, js
        self._every, self._timeout, self._stale = every_s, timeout_s, stale_s
        self._pools: dict[str, asyncpg.Pool] = {}
        self._consumers: dict[str, tuple[str, bool]] = {}  # durable -> (stream, bound)
        self._loops: dict[str, float] = {}  # fetch loop -> last beat (monotonic)
        self._stalls: dict[str, str] = {}  # durable -> why it is stalled
        self._checks: dict[str, str] = {}  # failing dependency -> why
        self._checked = False
        # Open until a check fails: actors of a process whose checks never run (tests composing
        # services in one task group) must still fetch.
        self._dependencies_ok = True
        self._loop_beat = time.monotonic()
        self._stopping = False
        self._recheck: anyio.Event | None = None

    # -- what the process registers ----------------------------------------------------------

    def watch_pool(self, name: str, pool: asyncpg.Pool) -> None:
        """Count a PostgreSQL pool among the dependencies (`SELECT 1` through it)."""
        self._pools[name] = pool

    def consumer_bound(self, stream: str, durable: str) -> None:
        """An actor bound its durable consumer; its fetch loop is now watched for liveness."""
        self._consumers[durable] = (stream, True)
        self._loops[durable] = time.monotonic()

    def loop_ended(self, durable: str) -> None:
        """An actor stopped fetching (drain or cancellation): no longer expected to beat."""
        self._loops.pop(durable, None)
        self._stalls.pop(durable, None)
        stream, _ = self._consumers.get(durable, ("", False))
        self._consumers[durable] = (stream, False)

    def beat(self, durable: str) -> None:
        """The fetch loop of `durable` went round."""
        if durable in self._loops:
            self._loops[durable] = time.monotonic()

    def consumer_stalled(self, durable: str, seconds: float, pending: int) -> None:
        """What `libs.stall` saw of `durable`: stalled for `seconds` (0: moving)."""
        if seconds > 0:
            why = f"stalled: {pending} waiting, none delivered for {seconds:.0f}s"
            if durable not in self._stalls:
                log.warning("not ready: consumer %s %s", durable, why)
            self._stalls[durable] = why
        elif self._stalls.pop(durable, None) is not None:
            log.info("consumer %s delivers again", durable)

    def stopping(self) -> None:
        """The process drains: not ready any more (the endpoints stay live)."""
        self._stopping = True

    def suspect(self) -> None:
        """Something failed that a dependency's outage would explain: check now."""
        if self._recheck is not None:
            self._recheck.set()

    # -- what the actors and probes read ------------------------------------------------------

    @property
    def dependencies_ok(self) -> bool:
        """NATS and every watched pool passed the last check."""
        return self._dependencies_ok

    async def wait_dependencies(self, durable: str, stopping: anyio.Event) -> None:
        """Return once the dependencies pass their checks (or the process stops)."""
        while not self._dependencies_ok and not stopping.is_set():
            self.beat(durable)  # waiting here is the loop alive, not stuck
            with anyio.move_on_after(0.2):
                await stopping.wait()

    def live(self) -> tuple[bool, dict[str, str]]:
        """Whether the event loop and every fetch loop beat within `stale_s`, and what did not."""
        now = time.monotonic()
        stale = {
            name: f"no beat for {now - at:.0f}s"
            for name, at in [("event-loop", self._loop_beat), *self._loops.items()]
            if now - at > self._stale
        }
        return not stale, stale or {"all": "ok"}

    def ready(self) -> tuple[bool, dict[str, str]]:
        """Whether the process should be sent work, and why not."""
        problems = dict(self._checks)
        if not self._checked:
            problems["checks"] = "not run yet"
        for durable, (_, bound) in self._consumers.items():
            if not bound:
                problems.setdefault(f"consumer {durable}", "not bound")
        for durable, why in self._stalls.items():
            problems.setdefault(f"consumer {durable}", why)
        if self._stopping:
            problems["process"] = "stopping"
        return not problems, problems or {"all": "ok"}

    # -- the check loop -----------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the checks now and every `every_s` (or when suspected) until cancelled."""
        self._recheck = anyio.Event()
        await self.check()
        task_status.started()
        while True:
            with anyio.move_on_after(self._every):
                await self._recheck.wait()
            self._recheck = anyio.Event()
            await self.check()

    async def check(self) -> None:
        """Check every dependency once and record the results."""
        self._loop_beat = time.monotonic()
        failing: dict[str, str] = {}
        nc = self._nc
        if nc is not None:
            if not nc.is_connected:
                failing["nats"] = "reconnecting" if nc.is_reconnecting else "not connected"
            elif nc.is_draining:
                failing["nats"] = "draining"
        for name, pool in self._pools.items():
            if _saturated(pool):
                # Every connection is out with a handler: waiting for one would report a busy
                # database as a dead one and stop the fetching that keeps it busy. A dead server
                # fails those handlers at once, which frees the connections for the next check.
                continue
            why = await self._probe(lambda p=pool: p.fetchval("SELECT 1", timeout=self._timeout))
            if why:
                failing[name] = why
        dependencies_ok = not failing
        js = self._js
        if js is not None and "nats" not in failing:
            for durable, (stream, bound) in list(self._consumers.items()):
                if not bound or durable not in self._loops:
                    continue
                why = await self._probe(
                    lambda s=stream, d=durable: js.consumer_info(s, d, timeout=self._timeout)
                )
                if why:
                    failing[f"consumer {durable}"] = why
        if failing != self._checks:
            if failing:
                log.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in failing.items()))
            elif self._checked:
                log.info("ready again")
        self._checks, self._dependencies_ok, self._checked = failing, dependencies_ok, True
        self._loop_beat = time.monotonic()

    async def _probe(self, call: Any) -> str:
        try:
            with anyio.fail_after(self._timeout):
                await call()
        except Exception as exc:  # any failure is the answer; the reason goes to the probe
            return f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__
        return ""


def _saturated(pool: asyncpg.Pool) -> bool:
    try:
        return bool(pool.get_idle_size() == 0 and pool.get_size() >= pool.get_max_size())
    except AttributeError:  # not an asyncpg pool: probe it
        return False
