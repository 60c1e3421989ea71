"""PostgreSQL re-drives what the bus dropped: a running run that no transaction locked for
`stall_s` seconds waits on a message that may be lost — the outcome of its proposal, the wake
after a committed decision, a redelivery a consumer leader took with it — and the sweeper
drives it again from the database (`PlannerService.redrive`):

- its last step proposed a command that ended: that outcome, as admission's registry records
  it (read-only), is delivered in-process, as the dispatcher's message would have been;
- that command has not ended: nothing (the dispatcher's own sweeper drives commands);
- it proposed one that admission refused (as invalid too) or asked a person about
  (admission's record of the proposal or of its invalid refusal, read-only): that refusal or
  ask is delivered in-process, as admission's message would have been (a wake would only
  propose again, and admission's answer to it, sent with the first's message id, would be
  dropped by the stream as a duplicate of the lost one);
- anything else (no steps yet, an observation, a read's or a branch's decision, a proposal
  that never reached admission): a wake, delivered in-process, takes the next step.

Driving a run is idempotent with its normal path: it happens under the run's row lock, a
recorded decision is reused (the model is not asked twice for a step), an outcome is observed
once, and what it publishes carries the message ids a delivery's effects carry, but for the
messages Writ sends itself (a proposal, a wake), whose ids get the sweep's suffix so the
stream's duplicate window does not drop them (admission judges a proposal once). A run
locked by a delivery is skipped (`claim_stalled`).

A run that waits for a person is not stalled until the person answered: from then on the
database holds what the lost message carried, and the run is driven as a stalled one is
(`claim_answered`): governance's recorded answer to the read it asked about is delivered
in-process, as governance's announcement would have been, the outcome of the command its
approved proposal became, as above, or admission's refusal of the proposal (a person rejected
it, asked for a revision, or let it expire). Each is taken once: under the run's row lock, by a
run still waiting on exactly that decision.

A run that ended owes one result message (to its host, or a branch's wake of the run that
called it), published after the transaction that ended it: that transaction sets the run's
`result_due` and publishing clears it. A run whose flag stayed set for `stall_s` (its planner
gone in between, with no delivery to repeat it) is woken in-process: an ended run's wake
publishes its result again, under the message id the first had (`claim_ended`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from services.planner.metrics import PlannerMetrics
from services.planner.store import (
    PlannerStore,
    claim_answered,
    claim_ended,
    claim_stalled,
    results_sent,
)

__all__ = ["SWEEP_CONCURRENCY", "RunSweeper"]

log = logging.getLogger("writ.planner")
# Runs driven at once by one sweep, each on a pooled connection of its own (`pool_size`).
SWEEP_CONCURRENCY = 4


class RunSweeper:
    """Finds stalled runs and drives each once more."""

    def __init__(
        self,
        *,
        store: PlannerStore,
        drive: Callable[[str, str], Awaitable[None]],
        metrics: PlannerMetrics,
        resend: Callable[[str, str], Awaitable[None]] | None = None,
        stall_s: float = 20.0,
        every_s: float = 5.0,
        limit: int = 64,
    ) -> None:
        self._store, self._drive, self._metrics = store, drive, metrics
        self._resend = resend
        self._stall_s, self._every_s, self._limit = stall_s, every_s, limit

    async def run(self) -> None:
        """Sweep every `every_s` seconds until cancelled; a failed sweep waits for the next."""
        while True:
            await anyio.sleep(self._every_s)
            try:
                await self.sweep()
            except Exception as exc:
                log.warning("run sweep failed: %r", exc)

    async def sweep(self) -> int:
        """Drive the runs stalled now; how many were driven without an error."""
        async with self._store.acquire() as conn:
            stalled = await claim_stalled(conn, stall_s=self._stall_s, limit=self._limit)
            stalled += await claim_answered(conn, stall_s=self._stall_s, limit=self._limit)
            ended = []
            if self._resend is not None:
                ended = await claim_ended(conn, stall_s=self._stall_s, limit=self._limit)
        driven = 0
        slots = anyio.Semaphore(SWEEP_CONCURRENCY)

        async def one(tenant: str, run_id: str) -> None:
            nonlocal driven
            async with slots:
                log.info("sweeper drives run %s:%s again", tenant, run_id)
                self._metrics.swept.inc()
                try:
                    await self._drive(tenant, run_id)
                except Exception as exc:  # this run alone waits for a later sweep
                    log.info("sweeping run %s left it for later: %r", run_id, exc)
                    return
                driven += 1

        async def resend(tenant: str, run_id: str) -> None:
            nonlocal driven
            assert self._resend is not None
            async with slots:
                log.info("sweeper publishes the result of run %s:%s again", tenant, run_id)
                self._metrics.swept.inc()
                try:
                    await self._resend(tenant, run_id)
                    async with self._store.acquire() as conn:
                        await results_sent(conn, [run_id])  # a branch's end wakes its caller
                except Exception as exc:  # this run alone waits for a later sweep
                    log.info("resending run %s's result left it for later: %r", run_id, exc)
                    return
                driven += 1

        async with anyio.create_task_group() as tg:
            for tenant, run_id in stalled:
                tg.start_soon(one, tenant, run_id)
            for tenant, run_id in ended:
                tg.start_soon(resend, tenant, run_id)
        return driven
