"""The full run path: a host's `RunRequest` through all six services to its `RunResult`.

Ingress (token) -> retrieval (evidence) -> planner (scripted: one `crm.note.create`) ->
admission -> governance -> relay -> dispatcher -> simulated CRM -> planner (answer) -> result.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.measure import Awaiting
from schemas import subjects
from schemas.host import CommandResult, RunRequest, RunResult
from writ.demo import DEMO_INPUT
from writ.stack import Stack

__all__ = ["RunPath"]

TENANT = "acme"
PRINCIPAL = "alice@acme.example"
TIMEOUT_S = 90.0


class RunPath:
    """Plays the host: signs, publishes run requests, and waits for each one's result."""

    def __init__(self, stack: Stack, nc: Client) -> None:
        self._stack, self._nc, self._js = stack, nc, nc.jetstream()
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
        request = RunRequest(request_id=request_id, agent="crm-assistant", input=DEMO_INPUT,
                             token=self._stack.token(TENANT, PRINCIPAL))
        self._results.expect(request_id)
        try:
            await self._js.publish(subjects.request(TENANT), msgspec.json.encode(request),
                                   headers={"Nats-Msg-Id": request_id}, timeout=TIMEOUT_S)
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

    def _count(self, status: str, detail: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "succeeded" and not self.problem:
            self.problem = f"{status}: {detail}"
