"""A fetched batch of admitted commands, claimed together (see `Batches.handle_batch`).

The plain commands of a batch share their commits; every other one is executed alone
(`execution.py`).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import anyio
import msgspec
from opentelemetry import trace

from actions import ACTIONS
from libs.actor import Delivery
from libs.errors import Fenced, RetryableError
from libs.runtime import Runtime
from libs.telemetry import inject_context
from schemas.admission import DispatchCommand
from services.dispatcher.breaker import Admission, Breakers
from services.dispatcher.connectors import Connector, Result
from services.dispatcher.execution import Execution, final_of
from services.dispatcher.meters import DispatcherMeters
from services.dispatcher.outcomes import Outcomes
from services.dispatcher.store import Claim, DispatcherStore

__all__ = ["Batches"]


class _Plain:
    """One plain command of a batch (see `Batches.handle_batch`), as far as it got."""

    __slots__ = ("admission", "attempt", "claim", "connector", "elapsed_s", "index", "result")

    def __init__(self, *, index: int, claim: Claim, connector: Connector) -> None:
        self.index, self.claim, self.connector = index, claim, connector
        self.admission: Admission | None = None  # the breaker's, for the call
        self.attempt: int | None = None
        self.result: Result | None = None
        self.elapsed_s = 0.0  # how long the connector call took


class Batches:
    """Claims, records and calls a fetched batch's plain commands together."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: DispatcherStore,
        connectors: dict[str, Connector],
        outcomes: Outcomes,
        breakers: Breakers,
        meters: DispatcherMeters,
        execution: Execution,
        worker: str,
        lease_s: float,
        recheck_reuse_s: float,
    ) -> None:
        self._rt, self._store, self._connectors = rt, store, connectors
        self._outcomes, self._breakers, self._execution = outcomes, breakers, execution
        self._attempts, self._rechecks = meters.attempts, meters.rechecks
        self._breaker_refused = meters.breaker_refused
        self._worker, self._lease_s, self._recheck_reuse_s = worker, lease_s, recheck_reuse_s

    async def handle_batch(
        self, deliveries: list[Delivery[DispatchCommand]]
    ) -> list[BaseException | None]:
        """A fetched batch: claimed in one fenced statement; the plain commands (first holder,
        the admission's allow current, a remote connector, no facts to revalidate) record
        their intents in one transaction, call their connectors, and record their outcomes in
        one transaction; every other command goes through `Execution.execute` alone.

        Each claim, intent and outcome statement is fenced on its own epoch: a fenced command's
        result is `Fenced` and its delivery is left alone. Raises only if the claim failed
        (nothing committed); the actor then takes the deliveries one by one.
        """
        results: list[BaseException | None] = [None] * len(deliveries)
        self._rt.faults.crash_if("dispatcher.before_claim")
        claims = await self._store.claim_many(
            [(d.message.tenant, d.message.operation_id) for d in deliveries],
            worker=self._worker,
            lease_s=self._lease_s,
            reuse_decision_s=self._recheck_reuse_s,
        )
        plain: list[_Plain] = []
        alone: list[tuple[int, Claim | None]] = []
        for index, delivery in enumerate(deliveries):
            # A command listed twice is claimed once: the second delivery finds it held.
            claim = claims.pop((delivery.message.tenant, delivery.message.operation_id), None)
            job = None if claim is None else self._plain(index, claim)
            if job is None:
                alone.append((index, claim))
            else:
                plain.append(job)

        async def one(index: int, claim: Claim | None) -> None:
            delivery = deliveries[index]
            try:
                with (
                    trace.use_span(delivery.span, end_on_exit=False),
                    self._rt.tracer.start_as_current_span("dispatch") as span,
                ):
                    span.set_attribute("writ.operation_id", delivery.message.operation_id)
                    if claim is None:
                        await self._execution.not_claimed(delivery.message)
                    else:
                        span.set_attribute("writ.lease_epoch", claim.lease_epoch)
                        await self._execution.execute(claim, delivery)
            except Exception as exc:
                results[index] = exc

        async with anyio.create_task_group() as tg:
            for index, claim in alone:
                tg.start_soon(one, index, claim)
            if plain:
                tg.start_soon(self._dispatch_plain, deliveries, plain, results)
        await self._rt.faults.reach(
            "dispatcher.before_ack", *(d.message.operation_id for d in deliveries)
        )
        return results

    def _plain(self, index: int, claim: Claim) -> _Plain | None:
        """The claim as a plain command (see `handle_batch`), or None to execute it alone."""
        contract = ACTIONS.get(claim.action)
        if (
            contract is None
            or contract.connector not in self._connectors
            or claim.lease_epoch != 1
            or not claim.decision_current
            or claim.expires_at <= datetime.now(UTC)
            or (claim.preview and contract.facts is not None)
        ):
            return None
        try:
            contract.decode_arguments(claim.arguments)
            if claim.preview:
                contract.decode_preview(claim.preview)
        except msgspec.ValidationError:
            return None  # `_execute` fails it, with its reason
        claim = msgspec.structs.replace(
            claim,
            recheck=f"admission decision {claim.decision_id} "
            f"(policy epoch {claim.policy_epoch} unchanged)",
        )
        return _Plain(index=index, claim=claim, connector=self._connectors[contract.connector])

    async def _dispatch_plain(
        self,
        deliveries: list[Delivery[DispatchCommand]],
        plain: list[_Plain],
        results: list[BaseException | None],
    ) -> None:
        """Intents (one commit), connector calls, plain outcomes (one commit), outcomes out."""
        ready: list[_Plain] = []
        for job in plain:
            self._rechecks.labels("reused").inc()
            breaker = self._breakers.for_tool(job.claim.action)
            job.admission = breaker.admit()
            if job.admission.allowed:
                ready.append(job)
                continue
            self._breaker_refused.labels(job.claim.action).inc()
            try:
                await self._store.release(
                    job.claim,
                    None,
                    result="transient",
                    detail=f"circuit open for {job.claim.action}",
                    not_before_s=job.admission.retry_after_s,
                )
                raise RetryableError(
                    f"circuit open for {job.claim.action}",
                    delay=max(job.admission.retry_after_s, 0.1),
                )
            except Exception as exc:
                results[job.index] = exc
        if not ready:
            return
        starts = []
        for job in ready:
            with trace.use_span(deliveries[job.index].span, end_on_exit=False):
                starts.append(
                    (job.claim, job.connector.name, inject_context({}).get("traceparent"))
                )
        try:
            # The intents are durable before any connector is called.
            attempts = await self._store.start_attempts(starts, worker=self._worker)
        except Exception as exc:
            for job in ready:
                results[job.index] = exc
            return
        await self._rt.faults.reach(  # intents recorded, nothing sent
            "dispatcher.before_send", *(job.claim.operation_id for job in ready)
        )
        called: list[_Plain] = []
        for job, attempt in zip(ready, attempts, strict=True):
            if attempt is None:
                results[job.index] = Fenced("lease taken over", operation_id=job.claim.operation_id)
            else:
                job.attempt = attempt
                called.append(job)

        async def call(job: _Plain) -> None:
            claim, delivery = job.claim, deliveries[job.index]
            started = time.monotonic()
            try:
                with trace.use_span(delivery.span, end_on_exit=False):
                    job.result = await self._execution.guarded(
                        claim,
                        delivery,
                        job.connector.execute(
                            claim.action,
                            claim.arguments,
                            key=f"{claim.tenant}:{claim.operation_id}",
                            expected_revision=claim.expected_revision,
                            authorization=claim.authorization,
                        ),
                    )
            except Exception as exc:
                results[job.index] = exc
            job.elapsed_s = time.monotonic() - started

        async with anyio.create_task_group() as tg:
            for job in called:
                tg.start_soon(call, job)
        for job in called:
            if job.result is not None:
                assert job.admission is not None
                self._breakers.for_tool(job.claim.action).record(
                    job.admission, self._execution.outcome(job.result, job.elapsed_s)
                )
        await self._rt.faults.reach(
            "dispatcher.after_remote_write", *(job.claim.operation_id for job in called)
        )
        finishing: list[tuple[_Plain, tuple[str, str, str | None, str | None]]] = []
        for job in called:
            if job.result is None:
                continue
            final = final_of(job.result, job.connector)
            if final is not None:
                finishing.append((job, final))
                continue
            try:  # give the lease back, as alone
                assert job.attempt is not None
                await self._execution.conclude(job.claim, job.attempt, job.connector, job.result)
            except Exception as exc:
                results[job.index] = exc
        if not finishing:
            return
        try:
            rows = []
            for job, final in finishing:
                assert job.attempt is not None  # set when its attempt started
                rows.append((job.claim, job.attempt, *final))
            finished = await self._store.finish_many(rows)
        except Exception as exc:
            for job, _ in finishing:
                results[job.index] = exc
            return

        async def publish_outcome(
            job: _Plain, state: str, receipt: str | None, reason: str | None
        ) -> None:
            claim = job.claim
            try:
                await self._outcomes.of_claim(claim, state, receipt, reason)
            except Exception as exc:  # redelivered, it finds the outcome and publishes it
                results[job.index] = exc

        async with anyio.create_task_group() as tg:
            for (job, (state, result, receipt, reason)), done in zip(
                finishing, finished, strict=True
            ):
                if not done:
                    results[job.index] = Fenced(
                        "lease taken over before finalising", operation_id=job.claim.operation_id
                    )
                    continue
                self._attempts.labels(job.connector.name, result).inc()
                tg.start_soon(publish_outcome, job, state, receipt, reason)
