"""Dispatcher: the only process with connector credentials. It executes admitted commands.

It claims a command under a lease fenced in Postgres, re-checks it (approval not expired, policy
still allows, principal not revoked), calls the connector with the operation id as the
idempotency key, records the attempt and the outcome, and only then acks (docs/design.md §5).

Progress is reported only after a fenced renewal of the lease succeeded: a worker whose lease
was taken over never acks, naks or reports progress again, because JetStream matches those by
stream sequence alone and a stale one would settle the new holder's delivery.

Beside the delivery loop (one command, or a fetched batch claimed together), it sweeps stranded
commands from Postgres. Its other parts: `facts.py` reads the state a preview stands on (for
admission, and for revalidation here), `reconciliation.py` serves operators the commands that
ended `unknown`, `outcomes.py` publishes recorded outcomes, `connectors.py` holds the systems'
addresses and credentials, `breaker.py` the per-tool circuit breakers, `store.py` the SQL.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Gauge

from actions import ACTIONS, ActionContract
from actions.base import Stale
from actions.email_draft_apply import EmailDraftApply
from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec
from libs.decide import DecideUnavailable, decide
from libs.errors import Fenced, PermanentError, RetryableError, single_error
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from libs.telemetry import inject_context, links_to, refresh_every
from schemas import subjects
from schemas.admission import DispatchCommand
from schemas.governance import DecideRequest, Decision
from services.dispatcher.breaker import (
    STATE_VALUES,
    Admission,
    Breakers,
    BreakerState,
    Outcome,
    call_outcome,
)
from services.dispatcher.connectors import Connector, Result
from services.dispatcher.facts import FactsReader
from services.dispatcher.outcomes import Outcomes
from services.dispatcher.reconciliation import Reconciliation
from services.dispatcher.store import TERMINAL, Claim, DispatcherStore

__all__ = ["DispatcherService", "inbox"]

log = logging.getLogger("writ.dispatcher")
# An attempt's results (the CHECK on dispatcher.attempts.result).
_ATTEMPT_RESULTS = ("succeeded", "failed", "transient", "lost", "revision_required")


def inbox(ack_wait_s: float) -> ConsumerSpec:
    """The dispatch consumer; its `ack_wait` is the lease's clock."""
    return ConsumerSpec(
        stream="WRIT_CMD",
        durable="dispatcher",
        filter_subjects=subjects.DISPATCH_IN,
        ack_wait_s=ack_wait_s,
        max_deliver=50,
    )


def _final(result: Result, connector: Connector) -> tuple[str, str, str | None, str | None] | None:
    """(state, attempt result, receipt, reason) a connector's result ends the command with, or
    None when the lease must go back for a later attempt instead."""
    if result.kind == "succeeded":
        return "succeeded", "succeeded", result.receipt, None
    if result.kind == "rejected":
        return "failed", "failed", None, result.detail
    if result.kind == "revision_mismatch":
        # A failed precondition goes back to review; never retried without it.
        return "revision_required", "revision_required", None, result.detail
    if result.kind == "transient" or connector.contract != "none":
        return None
    # A lost response from a provider that cannot prove what happened: say so.
    return "unknown", "lost", None, result.detail


# Stranded commands one sweep re-drives at once.
_SWEEP_CONCURRENCY = 16


class _Plain:
    """One plain command of a batch (see `DispatcherService.handle_batch`), as far as it got."""

    __slots__ = ("admission", "attempt", "claim", "connector", "elapsed_s", "index", "result")

    def __init__(self, *, index: int, claim: Claim, connector: Connector) -> None:
        self.index, self.claim, self.connector = index, claim, connector
        self.admission: Admission | None = None  # the breaker's, for the call
        self.attempt: int | None = None
        self.result: Result | None = None
        self.elapsed_s = 0.0  # how long the connector call took


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
        self._rt, self._store, self._connectors = rt, store, connectors
        self._outcomes = Outcomes(rt.js)
        self._facts = FactsReader(store=store, connectors=connectors)
        self._reconciliation = Reconciliation(store=store, outcomes=self._outcomes)
        # Up to `batches` fetched batches of up to `batch_size` commands in flight; a batch's
        # claims, intents and plain outcomes are each one commit (`handle_batch`).
        self._batch_size, self._batches = batch_size, batches
        self._sealer = sealer
        self._lease_s, self._call_timeout_s = lease_s, call_timeout_s
        self._sweep_every_s, self._pending_grace_s = sweep_every_s, pending_grace_s
        self._decide_timeout_s, self._gauges_every_s = decide_timeout_s, gauges_every_s
        self._recheck_reuse_s = recheck_reuse_s
        self._worker = worker or f"dispatcher-{uuid.uuid4().hex[:8]}"
        self._decoder = msgspec.json.Decoder(DispatchCommand)
        self._encoder = msgspec.json.Encoder()
        # Tool names come from the action catalog (unknown actions fail before any breaker is
        # made), so the `tool` label is a bounded set.
        self._breaker_state = Gauge(
            "writ_dispatcher_breaker_state",
            "Circuit breaker per tool: 0 closed, 1 half_open, 2 open",
            ["tool"],
            registry=rt.registry,
        )
        self._breaker_refused = Counter(
            "writ_dispatcher_breaker_refused",
            "Calls delayed because the tool's breaker was open",
            ["tool"],
            registry=rt.registry,
        )
        # `connector` is a connector's name (or "none": no call was made), `result` one of
        # the attempt results the attempts table allows: both bounded sets.
        self._attempts = Counter(
            "writ_dispatcher_attempts",
            "Dispatch attempts finished, by connector and result",
            ["connector", "result"],
            registry=rt.registry,
        )
        # `outcome`: "reused" (the admission's allow stood: policy epoch unchanged) or "asked"
        # (decide was asked again).
        self._rechecks = Counter(
            "writ_dispatcher_rechecks",
            "Policy re-checks before execution, by how they were answered",
            ["outcome"],
            registry=rt.registry,
        )
        for outcome in ("reused", "asked"):
            self._rechecks.labels(outcome)
        self._unknown = Gauge(
            "writ_dispatcher_unknown_commands",
            "Commands in state unknown, awaiting reconciliation",
            registry=rt.registry,
        )
        self._breakers = Breakers(
            threshold=breaker_threshold,
            cooldown_s=breaker_cooldown_s,
            on_change=self._breaker_moved,
        )
        for action, contract in ACTIONS.items():
            if contract.connector in connectors:
                # Every tool is on the dashboard from the start (rate() needs the zero too).
                self._breaker_state.labels(action).set(STATE_VALUES["closed"])
                self._breaker_refused.labels(action)
        for name in [*connectors, "local"]:  # "local": operations in Postgres, no connector
            for result in _ATTEMPT_RESULTS:
                self._attempts.labels(name, result)

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
            tg.start_soon(self._sweep_forever)
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
                concurrency=self._batches,
                metrics=self._rt.metrics,
                tracer=self._rt.tracer,
                stopping=self._rt.stopping,
                ack_sync=True,
                heartbeat=False,
                health=self._rt.health,
                task_status=task_status,
                backoff_max_s=self._rt.retry_backoff_max_s,
            )
            tg.cancel_scope.cancel()

    async def refresh_gauges(self) -> None:
        """Read how many commands wait in `unknown` into its gauge."""
        self._unknown.set(await self._store.count_unknown())

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
                await self._not_claimed(cmd)
            else:
                span.set_attribute("writ.lease_epoch", claim.lease_epoch)
                await self._execute(claim, delivery)
        self._rt.faults.crash_if("dispatcher.before_ack")

    async def handle_batch(
        self, deliveries: list[Delivery[DispatchCommand]]
    ) -> list[BaseException | None]:
        """A fetched batch: claimed in one fenced statement; the plain commands (first holder,
        the admission's allow current, a remote connector, no facts to revalidate) record
        their intents in one transaction, call their connectors, and record their outcomes in
        one transaction; every other command goes through `_execute` alone.

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
                        await self._not_claimed(delivery.message)
                    else:
                        span.set_attribute("writ.lease_epoch", claim.lease_epoch)
                        await self._execute(claim, delivery)
            except Exception as exc:
                results[index] = exc

        async with anyio.create_task_group() as tg:
            for index, claim in alone:
                tg.start_soon(one, index, claim)
            if plain:
                tg.start_soon(self._dispatch_plain, deliveries, plain, results)
        self._rt.faults.crash_if("dispatcher.before_ack")
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
                    job.result = await self._guarded(
                        claim,
                        delivery,
                        job.connector.execute(
                            claim.action,
                            claim.arguments,
                            key=f"{claim.tenant}:{claim.operation_id}",
                            expected_revision=claim.expected_revision,
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
                    job.admission, self._outcome(job.result, job.elapsed_s)
                )
        self._rt.faults.crash_if("dispatcher.after_remote_write")
        finishing: list[tuple[_Plain, tuple[str, str, str | None, str | None]]] = []
        for job in called:
            if job.result is None:
                continue
            final = _final(job.result, job.connector)
            if final is not None:
                finishing.append((job, final))
                continue
            try:  # give the lease back, as alone
                assert job.attempt is not None
                await self._conclude(job.claim, job.attempt, job.connector, job.result)
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
                await self._outcomes.publish(
                    claim.tenant,
                    claim.operation_id,
                    claim.run_id,
                    claim.step,
                    claim.action,
                    state,
                    receipt,
                    reason,
                    origin=claim.origin,
                )
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

    async def _not_claimed(self, cmd: DispatchCommand) -> None:
        current = await self._store.current(cmd.tenant, cmd.operation_id)
        if current is None:
            raise PermanentError(f"no command {cmd.tenant}:{cmd.operation_id}")
        if current.state in TERMINAL:
            # Delivered again after the end: answer with the recorded outcome, do nothing else.
            await self._outcomes.publish(
                cmd.tenant,
                cmd.operation_id,
                current.run_id,
                current.step,
                current.action,
                current.state,
                current.receipt,
                current.reason,
                origin=current.origin,
            )
            return
        remaining = 1.0
        if current.lease_until is not None:
            remaining = (current.lease_until - datetime.now(UTC)).total_seconds()
        raise RetryableError("another worker holds the lease", delay=max(remaining, 0.5))

    async def _execute(self, claim: Claim, delivery: Delivery[Any] | None) -> None:
        contract = ACTIONS.get(claim.action)
        local = contract is not None and contract.connector == "local"
        if contract is None or not (local or contract.connector in self._connectors):
            await self._finish(
                claim,
                None,
                state="failed",
                result="failed",
                receipt=None,
                reason=f"no connector for {claim.action}",
            )
            return
        if claim.expires_at <= datetime.now(UTC):
            await self._finish(
                claim,
                None,
                state="expired",
                result="failed",
                receipt=None,
                reason="the approval expired before dispatch",
            )
            return
        try:
            # An operation is only ever decoded with its own contract's types.
            arguments = contract.decode_arguments(claim.arguments)
            preview = contract.decode_preview(claim.preview) if claim.preview else None
        except msgspec.ValidationError as exc:
            log.error(
                "command %s does not decode under %s: %r", claim.operation_id, claim.action, exc
            )
            await self._finish(
                claim,
                None,
                state="failed",
                result="failed",
                receipt=None,
                reason="the stored command does not decode under its contract",
            )
            return
        if claim.decision_current:
            # Nothing `decide` reads for this call changed since the admission's allow (the
            # policy epoch stands, read in the claim's snapshot): that allow is the re-check.
            self._rechecks.labels("reused").inc()
            claim = msgspec.structs.replace(
                claim,
                recheck=f"admission decision {claim.decision_id} "
                f"(policy epoch {claim.policy_epoch} unchanged)",
            )
        else:
            decision = await self._recheck(claim, arguments)
            self._rechecks.labels("asked").inc()
            if decision.verdict != "allow":
                await self._finish(
                    claim,
                    None,
                    state="denied",
                    result="failed",
                    receipt=None,
                    reason=f"at dispatch, decide line {decision.line}: {decision.reason}",
                )
                return
            claim = msgspec.structs.replace(claim, recheck=f"decision {decision.decision_id}")
        trace.get_current_span().set_attribute("writ.recheck", claim.recheck or "")
        if local:
            await self._execute_local(claim, contract, arguments, preview)
            return
        connector = self._connectors[contract.connector]
        key = f"{claim.tenant}:{claim.operation_id}"
        # The first holder (epoch 1) cannot have predecessors: skip the lookup on the hot path.
        prior = await self._store.prior_attempts(claim) if claim.lease_epoch > 1 else []
        span = trace.get_current_span()
        for earlier in prior:  # each earlier holder's attempt, in whatever trace it ran
            for link in links_to(earlier.traceparent, "earlier attempt"):
                span.add_link(link.context, link.attributes)
        if prior:
            # An earlier holder may have reached the provider: its contract says what is safe.
            if connector.contract == "none":
                await self._finish(
                    claim,
                    None,
                    state="unknown",
                    result="lost",
                    receipt=None,
                    reason=f"an earlier attempt may have acted and {connector.name} cannot say",
                )
                return
            if connector.contract == "queryable":
                found = await self._guarded(
                    claim, delivery, connector.lookup(claim.action, key=key)
                )
                if found.kind == "succeeded":
                    await self._finish(
                        claim,
                        None,
                        state="succeeded",
                        result="succeeded",
                        receipt=found.receipt,
                        reason="found by key lookup",
                    )
                    return
                if found.kind == "rejected":
                    # The provider's answer is itself ambiguous (e.g. duplicates): a person
                    # must look, with this as evidence.
                    await self._finish(
                        claim,
                        None,
                        state="unknown",
                        result="lost",
                        receipt=None,
                        reason=found.detail,
                    )
                    return
                if found.kind != "not_found":
                    await self._store.release(claim, None, result="transient", detail=found.detail)
                    raise RetryableError(f"{connector.name} lookup: {found.detail}")
        if preview is not None and contract.facts is not None:
            # The preview claimed facts about the world: prove they still hold (the
            # approval-contracts note).
            stale = await self._stale(claim, contract, arguments, preview, key)
            if stale is not None:
                await self._finish(
                    claim,
                    None,
                    state="revision_required",
                    result="revision_required",
                    receipt=None,
                    reason=stale,
                )
                return
        breaker = self._breakers.for_tool(claim.action)
        admission = breaker.admit()
        if not admission.allowed:
            # Refused before anything was attempted: the command is delayed, not failed, and
            # no attempt is recorded. The lease goes back and the delivery returns when the
            # cooldown is over (or the sweeper brings the command back).
            self._breaker_refused.labels(claim.action).inc()
            await self._store.release(
                claim,
                None,
                result="transient",
                detail=f"circuit open for {claim.action}",
                not_before_s=admission.retry_after_s,
            )
            raise RetryableError(
                f"circuit open for {claim.action}", delay=max(admission.retry_after_s, 0.1)
            )
        attempt = await self._store.start_attempt(
            claim, worker=self._worker, connector=connector.name
        )
        started = time.monotonic()
        result = await self._guarded(
            claim,
            delivery,
            connector.execute(
                claim.action, claim.arguments, key=key, expected_revision=claim.expected_revision
            ),
        )
        breaker.record(admission, self._outcome(result, time.monotonic() - started))
        self._rt.faults.crash_if("dispatcher.after_remote_write")
        await self._conclude(claim, attempt, connector, result)

    async def _stale(
        self,
        claim: Claim,
        contract: ActionContract[Any, Any, Any, Any],
        arguments: Any,
        preview: Any,
        key: str,
    ) -> str | None:
        """Why the preview no longer holds (safe to show), or None if it still does."""
        ref = contract.facts_ref_of(arguments)
        if ref is None:
            return None
        try:
            raw = await self._facts.read(claim.tenant, ref.kind, ref.id)
        except RetryableError:
            await self._store.release(
                claim, None, result="transient", detail=f"cannot read the {ref.kind} to revalidate"
            )
            raise
        try:
            facts = None if raw is None else contract.decode_facts(raw)
            contract.revalidate(arguments, preview, facts, key=key)
        except Stale as exc:
            return str(exc)
        except msgspec.ValidationError:
            return f"the {ref.kind} can no longer be read as it was; a new proposal is needed"
        return None

    async def _execute_local(
        self,
        claim: Claim,
        contract: ActionContract[Any, Any, Any, Any],
        arguments: Any,
        preview: Any,
    ) -> None:
        """A local operation: recount, apply and record the outcome in one transaction."""
        assert isinstance(contract, EmailDraftApply)
        key = f"{claim.tenant}:{claim.operation_id}"
        attempt = await self._store.start_attempt(claim, worker=self._worker, connector="local")
        async with self._store.transaction() as conn:
            facts = await contract.read_local(conn, claim.tenant, arguments.draft_id, lock=True)
            reason: str | None
            try:
                contract.revalidate(arguments, preview, facts, key=key)
            except Stale as exc:
                state, result, receipt, reason = (
                    "revision_required",
                    "revision_required",
                    None,
                    str(exc),
                )
            else:
                receipt = await contract.apply_local(conn, claim.tenant, arguments, key)
                state, result, reason = "succeeded", "succeeded", None
            self._rt.faults.crash_if("dispatcher.after_remote_write")
            await self._store.finish(
                claim,
                attempt,
                state=state,
                result=result,
                receipt=receipt,
                reason=reason,
                conn=conn,
            )
        self._attempts.labels("local", result).inc()
        await self._outcomes.publish(
            claim.tenant,
            claim.operation_id,
            claim.run_id,
            claim.step,
            claim.action,
            state,
            receipt,
            reason,
            origin=claim.origin,
        )

    async def _conclude(
        self, claim: Claim, attempt: int, connector: Connector, result: Result
    ) -> None:
        final = _final(result, connector)
        if final is not None:
            state, recorded, receipt, reason = final
            await self._finish(
                claim,
                attempt,
                state=state,
                result=recorded,
                receipt=receipt,
                reason=reason,
                connector=connector.name,
            )
            return
        # Nothing happened, or the provider can dedupe (idempotent) or be asked
        # (queryable): give the lease back; the next holder replays or looks the key up.
        released = "lost" if result.kind == "lost" else "transient"
        await self._store.release(claim, attempt, result=released, detail=result.detail)
        self._attempts.labels(connector.name, released).inc()
        raise RetryableError(f"{connector.name}: {result.detail}")

    async def _guarded(
        self, claim: Claim, delivery: Delivery[Any] | None, call: Awaitable[Result]
    ) -> Result:
        """Run a connector call while renewing the lease (fenced) and reporting progress."""
        remaining = (claim.lease_until - datetime.now(UTC)).total_seconds()
        if remaining < self._call_timeout_s * 1.5:
            # Only start a call the lease comfortably outlives.
            await self._store.renew(claim, self._lease_s)
            if delivery is not None:
                await delivery.progress()
        outcome: list[Result] = []

        async def keep_lease() -> None:
            while True:
                await anyio.sleep(self._lease_s / 3)
                await self._store.renew(claim, self._lease_s)  # raises Fenced
                if delivery is not None:
                    await delivery.progress()

        async def perform(scope: anyio.CancelScope) -> None:
            outcome.append(await call)
            scope.cancel()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_lease)
                tg.start_soon(perform, tg.cancel_scope)
        except BaseExceptionGroup as group:
            raise single_error(group) from None
        return outcome[0]

    def _outcome(self, result: Result, elapsed_s: float) -> Outcome:
        """What a call's result means to its breaker (a call this side held up is neutral)."""
        return call_outcome(result.kind, elapsed_s=elapsed_s, timeout_s=self._call_timeout_s)

    def _breaker_moved(self, tool: str, state: BreakerState) -> None:
        self._breaker_state.labels(tool).set(STATE_VALUES[state])
        log.log(
            logging.INFO if state == "closed" else logging.WARNING,
            "circuit breaker for %s is now %s",
            tool,
            state,
        )

    async def _recheck(self, claim: Claim, arguments: Any) -> Decision:
        # The first argument in the contract's field order, as admission asked: the stored
        # jsonb gives its keys back in another order (shortest first).
        first = next(iter(msgspec.to_builtins(arguments).values()), "")
        ask = DecideRequest(
            tenant=claim.tenant,
            principal=claim.principal,
            agent=claim.agent,
            run_id=claim.run_id,
            tool=claim.action,
            first_argument=first[:512] if isinstance(first, str) else "",
            approval_id=claim.decision_id,
        )
        try:
            return await decide(self._rt.nc, ask, timeout=self._decide_timeout_s)
        except DecideUnavailable as exc:
            # Not knowing whether the action is still allowed is not an allow.
            await self._store.release(
                claim, None, result="transient", detail="governance unavailable"
            )
            raise RetryableError(f"cannot re-check the policy: {exc!r}", delay=1.0) from exc

    async def _finish(
        self,
        claim: Claim,
        attempt: int | None,
        *,
        state: str,
        result: str,
        receipt: str | None,
        reason: str | None,
        connector: str = "none",
    ) -> None:
        if attempt is None:
            connector = "none"  # the attempt recorded here made no call
            attempt = await self._store.start_attempt(
                claim, worker=self._worker, connector=connector
            )
        await self._store.finish(
            claim, attempt, state=state, result=result, receipt=receipt, reason=reason
        )
        self._attempts.labels(connector, result).inc()
        await self._outcomes.publish(
            claim.tenant,
            claim.operation_id,
            claim.run_id,
            claim.step,
            claim.action,
            state,
            receipt,
            reason,
            origin=claim.origin,
        )

    # -- the sweeper: Postgres re-drives what the bus may have lost --------------------------

    async def _sweep_forever(self) -> None:
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
                await self._execute(claim, None)
            except (RetryableError, Fenced) as exc:
                log.info("sweeper left %s for later: %s", stale.operation_id, exc)
                return False
        return True
