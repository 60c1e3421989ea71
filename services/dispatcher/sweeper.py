"""The dispatcher's sweeper: Postgres re-drives what the bus may have lost."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from opentelemetry import context as otel_context

from libs.errors import Fenced, RetryableError
from libs.runtime import Runtime
from libs.telemetry import links_to
from services.dispatcher.execution import Execution
from services.dispatcher.store import DispatcherStore

__all__ = ["Sweeper"]

log = logging.getLogger("writ.dispatcher")

# Stranded commands one sweep re-drives at once.
_SWEEP_CONCURRENCY = 16


class Sweeper:
    """Claims and executes the commands whose message or lease was lost."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: DispatcherStore,
        execution: Execution,
        worker: str,
        lease_s: float,
        call_timeout_s: float,
        recheck_reuse_s: float,
        sweep_every_s: float,
        pending_grace_s: float,
    ) -> None:
        self._rt, self._store, self._execution = rt, store, execution
        self._worker, self._lease_s, self._call_timeout_s = worker, lease_s, call_timeout_s
        self._recheck_reuse_s = recheck_reuse_s
        self._sweep_every_s, self._pending_grace_s = sweep_every_s, pending_grace_s

    async def sweep_forever(self) -> None:
        """Sweep every `sweep_every_s` until cancelled; a failed sweep waits for the next."""
        while True:
            await anyio.sleep(self._sweep_every_s)
            try:
                await self.sweep()
            except Exception as exc:
                log.warning("sweep failed: %r", exc)

    async def sweep(self) -> int:
        """Claim and execute commands whose message or lease was lost; returns how many.

        Up to `_SWEEP_CONCURRENCY` at once: after a fault that stranded many commands (a
        consumer leader lost with its deliveries) they are all re-driven within seconds, not
        one connector call after another.
        """
        done = 0
        slots = anyio.Semaphore(_SWEEP_CONCURRENCY)

        async def redrive(stale: Any) -> None:
            nonlocal done
            async with slots:
                try:
                    # Bounded: one call that never returns must not stop every later sweep
                    # (given up, it is a crash as far as the command knows: its lease runs
                    # out and the next sweep claims it again, under the same key).
                    with anyio.move_on_after(self._call_timeout_s * 4 + self._lease_s * 2):
                        if await self._redrive(stale):
                            done += 1
                except Exception as exc:  # this command alone waits for the next sweep
                    log.warning("sweeping %s failed: %r", stale.operation_id, exc)

        async with anyio.create_task_group() as tg:
            for stale in await self._store.stale(pending_grace_s=self._pending_grace_s):
                tg.start_soon(redrive, stale)
        return done

    async def _redrive(self, stale: Any) -> bool:
        """One stranded command claimed and executed; False if another worker has it or it
        must wait."""
        claim = await self._store.claim(
            stale.tenant,
            stale.operation_id,
            worker=self._worker,
            lease_s=self._lease_s,
            reuse_decision_s=self._recheck_reuse_s,
        )
        if claim is None:
            return False  # someone else got there first
        log.info("sweeper re-drives %s:%s (was %s)", stale.tenant, stale.operation_id, stale.state)
        # No message carries a context here: a new trace, linked to the admission's.
        with self._rt.tracer.start_as_current_span(
            "dispatch (re-driven)",
            context=otel_context.Context(),
            links=links_to(claim.traceparent, "re-driven"),
        ) as span:
            span.set_attribute("writ.operation_id", stale.operation_id)
            try:
                await self._execution.execute(claim, None)
            except (RetryableError, Fenced) as exc:
                log.info("sweeper left %s for later: %s", stale.operation_id, exc)
                return False
        return True
