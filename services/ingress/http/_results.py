"""What ingress hears on `writ.out.results.*`, for HTTP callers waiting on an answer.

One core subscription per tenant waited for; a caller registers what it waits for (a request
id, or a run id) before it hands its request on, so the answer cannot pass unseen. When the
process stops, `close` ends every wait at once: a long-poll answers with what it knows within
the HTTP server's graceful shutdown instead of being cut off by it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas import subjects
from schemas.host import ApprovalResult, CommandResult, DecisionResult, ReviewResult, RunResult

__all__ = ["AnyResult", "Results", "Waiter"]

AnyResult = RunResult | CommandResult | DecisionResult | ApprovalResult | ReviewResult
_DECODER: Final = msgspec.json.Decoder(AnyResult)


class Waiter:
    """The results that arrived for one key, in order."""

    def __init__(self, closing: anyio.Event) -> None:
        self.items: list[Any] = []
        self._changed = anyio.Event()
        self._closing = closing

    @property
    def closing(self) -> bool:
        """The process is stopping: wait no more, answer with what is known."""
        return self._closing.is_set()

    def wake(self) -> None:
        self._changed.set()

    def put(self, item: Any) -> None:
        self.items.append(item)
        self._changed.set()

    async def next(self, timeout: float) -> Any | None:
        """The next unseen result, or None after `timeout` seconds (at once when closing)."""
        with anyio.move_on_after(timeout):
            while not self.items:
                if self._closing.is_set():
                    return None
                await self._changed.wait()
                self._changed = anyio.Event()
            return self.items.pop(0)
        return None


class Results:
    """Routes each result on the host stream to whoever waits for it."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._waiters: dict[tuple[str, str], list[Waiter]] = {}
        # One core subscription per tenant someone waited for: never a wildcard, so a
        # publish on a subject no stream holds still finds no responder.
        self._subs: dict[str, Any] = {}
        self._lock = anyio.Lock()
        self._closing = anyio.Event()

    def close(self) -> None:
        """End every wait, now and to come: the process is stopping."""
        self._closing.set()
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake()

    async def start(self) -> None:
        """Nothing to do before the first wait (kept for symmetry with `stop`)."""

    async def stop(self) -> None:
        for sub in self._subs.values():
            await sub.unsubscribe()
        self._subs.clear()

    @asynccontextmanager
    async def watch(self, tenant: str, key: str) -> AsyncIterator[Waiter]:
        """Register for the results under `key` (a request id or a run id) while in scope."""
        if tenant not in self._subs:
            async with self._lock:
                if tenant not in self._subs:
                    self._subs[tenant] = await self._nc.subscribe(
                        subjects.result(tenant), cb=self._on
                    )
                    await self._nc.flush()
        waiter, slot = Waiter(self._closing), (tenant, key)
        self._waiters.setdefault(slot, []).append(waiter)
        try:
            yield waiter
        finally:
            waiters = self._waiters.get(slot, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(slot, None)

    async def _on(self, msg: Msg) -> None:
        if not self._waiters:
            return  # nobody waits: do not decode what only hosts read
        tenant = msg.subject.rsplit(".", 1)[-1]
        try:
            result = _DECODER.decode(msg.data)
        except msgspec.DecodeError:
            return
        keys = {result.request_id}
        if isinstance(result, RunResult) and result.run_id:
            keys.add(result.run_id)
        for key in keys:
            for waiter in self._waiters.get((tenant, key), ()):
                waiter.put(result)
