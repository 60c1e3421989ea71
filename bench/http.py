"""The HTTP door: `POST /runs` to the `RunResult` (`GET /runs/{id}/wait`), beside the NATS run
path at the same offered rate, and `GET /runs/{id}` requests per second."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import httpx
import nats

from bench.measure import closed_loop, open_loop
from bench.report import cpu_ms_per_op, sample_dict
from bench.runs import PRINCIPAL, TENANT, TIMEOUT_S, RunPath
from writ.demo import DEMO_INPUT
from writ.stack import Stack

if TYPE_CHECKING:
    from bench.phases import Bench

__all__ = ["HttpRunPath", "http_path"]

RUN_CONCURRENCY = 32
READ_CONCURRENCY = 32


class HttpRunPath:
    """Plays a host over HTTP: a fresh token and Idempotency-Key per run, then a long-poll."""

    def __init__(self, stack: Stack, client: httpx.AsyncClient) -> None:
        self._stack, self._client = stack, client
        self.statuses: dict[str, int] = {}
        self.run_ids: list[str] = []
        self._read_token = stack.token(TENANT, PRINCIPAL, ttl_s=3600)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._stack.token(TENANT, PRINCIPAL)}"}

    async def one(self) -> bool:
        """One run, from `POST /runs` to its `RunResult`."""
        try:
            started = await self._client.post(
                "/runs",
                json={"agent": "crm-assistant", "input": DEMO_INPUT},
                headers={**self._auth(), "Idempotency-Key": f"bench-{uuid.uuid4().hex}"},
            )
            if started.status_code != 202:
                self._count(f"http_{started.status_code}")
                return False
            run_id = started.json()["run_id"]
            result = await self._client.get(
                f"/runs/{run_id}/wait", headers=self._auth(), params={"timeout_s": TIMEOUT_S / 2}
            )
        except httpx.HTTPError as exc:
            self._count(type(exc).__name__)
            return False
        status = result.json().get("status", "?") if result.status_code == 200 else "timeout"
        self._count(status)
        if status == "succeeded" and len(self.run_ids) < 1000:
            self.run_ids.append(run_id)
        return status == "succeeded"

    async def read(self) -> bool:
        """One `GET /runs/{id}` of a finished run (the host's token reused, as a host would)."""
        run_id = self.run_ids[len(self.statuses) % len(self.run_ids)]
        response = await self._client.get(
            f"/runs/{run_id}", headers={"Authorization": f"Bearer {self._read_token}"}
        )
        return response.status_code == 200

    def _count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def http_path(bench: Bench) -> None:
    """Closed loop over HTTP, then HTTP and NATS at half that rate, then reads."""
    from bench.phases import BenchError, _s

    r, data, stack = bench.report, bench.report.data, bench.stack
    r.section("HTTP door: POST /runs -> six services -> GET /runs/{id}/wait (RunResult)")
    bench.alive()
    nc = await nats.connect(stack.nats_url, name="bench-http")
    limits = httpx.Limits(max_connections=RUN_CONCURRENCY * 2 + READ_CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=stack.api_url, timeout=TIMEOUT_S, limits=limits
    ) as client:
        path, nats_path = HttpRunPath(stack, client), RunPath(stack, nc)
        await nats_path.start()
        try:
            await bench.settle(nc, "http_run_path")
            watch = bench.window()
            best = await closed_loop(
                path.one,
                concurrency=RUN_CONCURRENCY,
                warmup_s=_s(3),
                duration_s=_s(15),
                watcher=watch,
            )
            if best.completed == 0:
                raise BenchError(f"no run over HTTP succeeded: {path.statuses}")
            data["http_run_path_runs_per_s"] = round(best.rate, 1)
            data["http_run_path"] = {
                **sample_dict(best),
                "statuses": path.statuses,
                "usage": watch.report(),
                "cpu_ms_per_run": cpu_ms_per_op(watch.report(), best.rate),
            }
            r.sample(f"closed loop C={RUN_CONCURRENCY}", best, "run/s")
            r.usage(watch.report(), per=(best.completed, "run"))

            rate = best.rate / 2
            for name, op in (("http", path.one), ("nats", nats_path.one)):
                await bench.settle(nc, f"{name}_run_half_rate")
                watch = bench.window()
                paced = await open_loop(
                    op, rate=rate, warmup_s=_s(2), duration_s=_s(10), watcher=watch
                )
                data[f"{name}_run_half_rate"] = {
                    **sample_dict(paced),
                    "offered_per_s": round(rate, 1),
                    "p50_ms": round(paced.latency_ms(50), 1),
                    "p99_ms": round(paced.latency_ms(99), 1),
                    "usage": watch.report(),
                }
                r.sample(
                    f"{name.upper()} open loop at {rate:.1f}/s (half the HTTP best)", paced, "run/s"
                )

            watch = bench.window()
            reads = await closed_loop(
                path.read,
                concurrency=READ_CONCURRENCY,
                warmup_s=_s(1),
                duration_s=_s(5),
                watcher=watch,
            )
            data["http_get_run_per_s"] = round(reads.rate, 1)
            data["http_get_run"] = {**sample_dict(reads), "usage": watch.report()}
            r.sample(f"GET /runs/{{id}} C={READ_CONCURRENCY}", reads, "req/s")
            r.usage(watch.report(), per=(reads.completed, "read"))
        finally:
            await nats_path.stop()
            await nc.close()
