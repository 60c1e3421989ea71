"""Dispatcher: the only process with connector credentials. It executes admitted commands.

It claims a command under a lease fenced in Postgres, re-checks it (approval not expired, policy
still allows, principal not revoked), calls the connector with the operation id as the
idempotency key, records the attempt and the outcome, and only then acks (docs/design.md §5).

Progress is reported only after a fenced renewal of the lease succeeded: a worker whose lease
was taken over never acks, naks or reports progress again, because JetStream matches those by
stream sequence alone and a stale one would settle the new holder's delivery.

Beside the delivery loop (one command, or a fetched batch claimed together: `batches.py`), it
sweeps stranded commands from Postgres (`sweeper.py`). Its other parts: `execution.py` takes one
claimed command to its outcome, `facts.py` reads the state a preview stands on (for admission,
and for revalidation here), `reconciliation.py` serves operators the commands that ended
`unknown`, `outcomes.py` publishes recorded outcomes, `connectors.py` holds the systems'
addresses and credentials, `breaker.py` the per-tool circuit breakers, `meters.py` the metrics,
`store.py` the SQL.
"""

from __future__ import annotations

import functools
import uuid

import anyio
import anyio.abc
import msgspec

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from libs.telemetry import refresh_every
from schemas import subjects
from schemas.admission import DispatchCommand
from services.dispatcher.batches import Batches
from services.dispatcher.breaker import Breakers
from services.dispatcher.connectors import Connector
from services.dispatcher.execution import Execution
from services.dispatcher.facts import FactsReader
from services.dispatcher.meters import DispatcherMeters
from services.dispatcher.outcomes import Outcomes
from services.dispatcher.reconciliation import Reconciliation
from services.dispatcher.store import DispatcherStore
from services.dispatcher.sweeper import Sweeper

__all__ = ["DispatcherService", "inbox"]


def inbox(ack_wait_s: float) -> ConsumerSpec:
    """The dispatch consumer; its `ack_wait` is the lease's clock."""
    return ConsumerSpec(
        stream="WRIT_CMD",
        durable="dispatcher",
        filter_subjects=subjects.DISPATCH_IN,
        ack_wait_s=ack_wait_s,
        max_deliver=50,
    )


class DispatcherService:
    """Executes each admitted command: exactly once where the provider allows, else `unknown`."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: DispatcherStore,
        connectors: dict[str, Connector],
        lease_s: float = 30.0,
        call_timeout_s: float = 10.0,
        sweep_every_s: float = 5.0,
        pending_grace_s: float = 60.0,
        decide_timeout_s: float = 2.0,
        recheck_reuse_s: float = 30.0,
        breaker_threshold: int = 3,
        breaker_cooldown_s: float = 30.0,
        worker: str | None = None,
        gauges_every_s: float = 5.0,
        sealer: Sealer | None = None,
        batch_size: int = 64,
        batches: int = 4,
    ) -> None:
        self._rt, self._store = rt, store
        self._outcomes = Outcomes(rt.js)
        self._facts = FactsReader(store=store, connectors=connectors)
        self._reconciliation = Reconciliation(store=store, outcomes=self._outcomes)
        # Up to `batches` fetched batches of up to `batch_size` commands in flight; a batch's
        # claims, intents and plain outcomes are each one commit (`Batches.handle_batch`).
        self._batch_size, self._batches_in_flight = batch_size, batches
        self._sealer = sealer
        self._lease_s, self._recheck_reuse_s = lease_s, recheck_reuse_s
        self._gauges_every_s = gauges_every_s
        self._worker = worker or f"dispatcher-{uuid.uuid4().hex[:8]}"
        self._decoder = msgspec.json.Decoder(DispatchCommand)
        self._meters = DispatcherMeters(registry=rt.registry, connectors=list(connectors))
        breakers = Breakers(
            threshold=breaker_threshold,
            cooldown_s=breaker_cooldown_s,
            on_change=self._meters.breaker_moved,
        )
        self._execution = Execution(
            rt=rt,
            store=store,
            connectors=connectors,
            outcomes=self._outcomes,
            facts=self._facts,
            breakers=breakers,
            meters=self._meters,
            worker=self._worker,
            lease_s=lease_s,
            call_timeout_s=call_timeout_s,
            decide_timeout_s=decide_timeout_s,
        )
        self._batches = Batches(
            rt=rt,
            store=store,
            connectors=connectors,
            outcomes=self._outcomes,
            breakers=breakers,
            meters=self._meters,
            execution=self._execution,
            worker=self._worker,
            lease_s=lease_s,
            recheck_reuse_s=recheck_reuse_s,
        )
        self._sweeper = Sweeper(
            rt=rt,
            store=store,
            execution=self._execution,
            worker=self._worker,
            lease_s=lease_s,
            call_timeout_s=call_timeout_s,
            recheck_reuse_s=recheck_reuse_s,
            sweep_every_s=sweep_every_s,
            pending_grace_s=pending_grace_s,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume admitted commands and sweep stranded ones until stopped."""
        self._rt.endpoints += [
            Endpoint("unknown", subjects.UNKNOWN_LIST, self._reconciliation.list_unknown),
            Endpoint("reconcile", subjects.RECONCILE, self._reconciliation.reconcile),
            Endpoint("facts", subjects.FACTS, self._facts.serve),
        ]
        async with anyio.create_task_group() as tg:
            if self._sealer is not None:
                await tg.start(self._sealer.run)  # chains and signs the audit journal
            tg.start_soon(self._sweeper.sweep_forever)
            tg.start_soon(
                functools.partial(
                    refresh_every,
                    self._gauges_every_s,
                    self.refresh_gauges,
                    stopping=self._rt.stopping,
                    what="dispatcher gauges",
                )
            )
            await run_actor(
                js=self._rt.js,
                spec=inbox(self._lease_s),
                decoder=self._decoder,
                handler=self.handle,
                batch_handler=self.handle_batch,
                batch_size=self._batch_size,
                concurrency=self._batches_in_flight,
                metrics=self._rt.metrics,
                tracer=self._rt.tracer,
                stopping=self._rt.stopping,
                ack_sync=True,
                heartbeat=False,
                health=self._rt.health,
                task_status=task_status,
                backoff_max_s=self._rt.retry_backoff_max_s,
                outage_limit_s=self._rt.outage_limit_s,
            )
            tg.cancel_scope.cancel()

    async def refresh_gauges(self) -> None:
        """Read how many commands wait in `unknown` into its gauge."""
        self._meters.unknown.set(await self._store.count_unknown())

    async def handle(self, delivery: Delivery[DispatchCommand]) -> None:
        """Claim, check, execute, record; raising `Fenced` leaves the delivery untouched."""
        cmd = delivery.message
        with self._rt.tracer.start_as_current_span("dispatch") as span:
            span.set_attribute("writ.operation_id", cmd.operation_id)
            self._rt.faults.crash_if("dispatcher.before_claim")
            claim = await self._store.claim(
                cmd.tenant,
                cmd.operation_id,
                worker=self._worker,
                lease_s=self._lease_s,
                reuse_decision_s=self._recheck_reuse_s,
            )
            if claim is None:
                await self._execution.not_claimed(cmd)
            else:
                span.set_attribute("writ.lease_epoch", claim.lease_epoch)
                await self._execution.execute(claim, delivery)
        await self._rt.faults.reach("dispatcher.before_ack", cmd.operation_id)

    async def handle_batch(
        self, deliveries: list[Delivery[DispatchCommand]]
    ) -> list[BaseException | None]:
        """A fetched batch, claimed together (`Batches.handle_batch`)."""
        return await self._batches.handle_batch(deliveries)

    async def sweep(self) -> int:
        """Claim and execute commands whose message or lease was lost; returns how many."""
        return await self._sweeper.sweep()
