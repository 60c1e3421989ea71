"""The full run path: a host's `RunRequest` through all six services to its `RunResult`.

Ingress (token) -> retrieval (evidence) -> planner (scripted: one `crm.note.create`) ->
admission -> governance -> relay -> dispatcher -> simulated CRM -> planner (answer) -> result.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.measure import Awaiting, closed_loop, open_loop
from bench.report import cpu_ms_per_op, sample_dict
from schemas import subjects
from schemas.host import CommandResult, RunRequest, RunResult
from writ.demo import DEMO_INPUT
from writ.stack import Stack

__all__ = ["SHAPES", "RunPath", "run_phase"]

# The shapes the peers run too (../shared/bench/peers): the run path's agent, and the demo
# agent's full shape (catalog request, a governed read, the note, the answer, the critic).
SHAPES = {"run_path": "crm-assistant", "full_path": "research-assistant"}

if TYPE_CHECKING:
    from bench.phases import Bench

TENANT = "acme"
PRINCIPAL = "alice@acme.example"
TIMEOUT_S = 90.0
WARM_RUNS = 10


class RunPath:
    """Plays the host: signs, publishes run requests for `agent`, and waits for each one's
    result."""

    def __init__(self, stack: Stack, nc: Client, agent: str = "crm-assistant") -> None:
        self._stack, self._nc, self._js = stack, nc, nc.jetstream()
        self._agent = agent
        self._results: Awaiting[RunResult] = Awaiting()
        self._decoder = msgspec.json.Decoder(RunResult | CommandResult)
        self._sub: Any = None
        self.statuses: dict[str, int] = {}
        self.problem = ""  # the first reason a run did not succeed

    async def start(self) -> None:
        """Subscribe to the tenant's results (a core subscription sees JetStream publishes)."""
        self._sub = await self._nc.subscribe(subjects.result(TENANT), cb=self._on_result)

    async def stop(self) -> None:
        """Unsubscribe."""
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _on_result(self, msg: Msg) -> None:
        try:
            result = self._decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        if isinstance(result, RunResult):
            self._results.resolve(result.request_id, result)

    async def one(self) -> bool:
        """One run, from the host's publish to its `RunResult`."""
        request_id = f"bench-{uuid.uuid4().hex}"
        # A fresh token per request, as a host would mint (signing is part of the host's cost).
        request = RunRequest(
            request_id=request_id,
            agent=self._agent,
            input=DEMO_INPUT,
            token=self._stack.token(TENANT, PRINCIPAL),
        )
        self._results.expect(request_id)
        try:
            await self._js.publish(
                subjects.request(TENANT),
                msgspec.json.encode(request),
                headers={"Nats-Msg-Id": request_id},
                timeout=TIMEOUT_S,
            )
        except Exception as exc:
            # Not stored, so no run: a failed operation, not one to wait for.
            self._results.discard(request_id)
            self._count("publish_failed", repr(exc))
            return False
        result = await self._results.wait(request_id, TIMEOUT_S)
        if result is None:
            self._count("timeout", f"no result within {TIMEOUT_S:.0f} s")
            return False
        error = result.error
        self._count(result.status, f"{error.code} {error.message}" if error else "")
        return result.status == "succeeded"

    async def many(self, runs: int, in_flight: int) -> int:
        """`runs` runs, `in_flight` at a time; how many did not succeed."""
        limiter = anyio.CapacityLimiter(in_flight)
        failed = 0

        async def one() -> None:
            nonlocal failed
            async with limiter:
                failed += not await self.one()

        async with anyio.create_task_group() as tg:
            for _ in range(runs):
                tg.start_soon(one)
        return failed

    def _count(self, status: str, detail: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "succeeded" and not self.problem:
            self.problem = f"{status}: {detail}"


async def run_phase(bench: Bench, key: str, title: str, *, concurrency: int, scale: float) -> None:
    """Whole runs of `SHAPES[key]`'s agent: one at a time, then `concurrency` in flight, then
    an open loop at half that rate (latency without queueing behind a saturated machine).
    Figures go under `<key>_*` (`run_path_runs_per_s`, `full_path_cpu_ms_per_run`, ...)."""
    from bench.phases import BenchError

    r, data = bench.report, bench.report.data
    r.section(title)
    bench.alive()
    nc = await nats.connect(bench.stack.nats_url, name=f"bench-{key}")
    path = RunPath(bench.stack, nc, SHAPES[key])
    await path.start()
    try:
        # A few runs first, however long they take: a fresh deployment's first runs (statements
        # prepared, code paths loaded) are not what the C=1 pass measures, and its warm-up
        # is a time, which one slow first run can outlast.
        for _ in range(WARM_RUNS):
            await path.one()
        await bench.settle(nc, f"{key}_unloaded")
        watch = bench.window()
        single = await closed_loop(
            path.one, concurrency=1, warmup_s=1 * scale, duration_s=4 * scale, watcher=watch
        )
        data[f"{key}_unloaded"] = {
            **sample_dict(single),
            "usage": watch.report(),
            "cpu_ms_per_run": cpu_ms_per_op(watch.report(), single.rate),
        }
        data[f"{key}_c1_p50_ms"] = data[f"{key}_unloaded"]["p50_ms"]
        r.sample("one at a time (C=1)", single, "run/s")
        if single.completed == 0:
            raise BenchError(f"no run succeeded: {path.statuses}; first problem: {path.problem}")
        path.statuses, path.problem = {}, ""
        await bench.settle(nc, key)
        watch = bench.window()
        sample = await closed_loop(
            path.one,
            concurrency=concurrency,
            warmup_s=3 * scale,
            duration_s=15 * scale,
            watcher=watch,
        )
        data[f"{key}_runs_per_s"] = round(sample.rate, 1)
        data[f"{key}_p50_ms"] = round(sample.latency_ms(50), 1)
        data[f"{key}_p99_ms"] = round(sample.latency_ms(99), 1)
        data[f"{key}_concurrency"] = concurrency
        data[key] = {
            **sample_dict(sample),
            "statuses": path.statuses,
            "problem": path.problem,
            "usage": watch.report(),
            "cpu_ms_per_run": cpu_ms_per_op(watch.report(), sample.rate),
        }
        # Every process, as the issue's and the peers' figures count it: the services,
        # nats-server, Postgres, the host this bench plays and the simulated CRM.
        data[f"{key}_cpu_ms_per_run"] = data[key]["cpu_ms_per_run"].get("total")
        r.sample(f"closed loop C={concurrency}", sample, "run/s")
        r.usage(watch.report(), per=(sample.completed, "run"))
        if sample.rate > 0:
            rate = sample.rate / 2
            path.statuses, path.problem = {}, ""
            await bench.settle(nc, f"{key}_half_rate")
            watch = bench.window()
            paced = await open_loop(
                path.one, rate=rate, warmup_s=2 * scale, duration_s=10 * scale, watcher=watch
            )
            data[f"{key}_half_rate"] = {
                **sample_dict(paced),
                "offered_per_s": round(rate, 1),
                "statuses": path.statuses,
                "usage": watch.report(),
            }
            data[f"{key}_half_rate_p99_ms"] = round(paced.latency_ms(99), 1)
            r.sample(f"open loop at {rate:.1f}/s (half the C={concurrency} rate)", paced, "run/s")
    finally:
        await path.stop()
        await nc.close()
