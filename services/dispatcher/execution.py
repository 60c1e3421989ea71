"""One command's execution: re-check, revalidate, call the connector under a renewed lease,
record the attempt and the outcome (docs/design.md §5).

The delivery loop (`service.py`), a fetched batch's commands that cannot go the plain way
(`batches.py`) and the sweeper (`sweeper.py`) all execute a claimed command here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

import anyio
import msgspec
from opentelemetry import trace

from actions import ACTIONS, ActionContract
from actions.base import Stale
from actions.email_draft_apply import EmailDraftApply
from libs.actor import Delivery
from libs.decide import DecideUnavailable, decide
from libs.errors import PermanentError, RetryableError, single_error
from libs.runtime import Runtime
from libs.telemetry import links_to
from schemas.admission import DispatchCommand
from schemas.governance import DecideRequest, Decision
from services.dispatcher.breaker import Breakers, Outcome, call_outcome
from services.dispatcher.connectors import Connector, Result
from services.dispatcher.facts import FactsReader
from services.dispatcher.meters import DispatcherMeters
from services.dispatcher.outcomes import Outcomes
from services.dispatcher.store import TERMINAL, Claim, DispatcherStore

__all__ = ["Execution", "final_of"]

log = logging.getLogger("writ.dispatcher")


def final_of(
    result: Result, connector: Connector
) -> tuple[str, str, str | None, str | None] | None:
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


class Execution:
    """Executes claimed commands: exactly once where the provider allows, else `unknown`."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: DispatcherStore,
        connectors: dict[str, Connector],
        outcomes: Outcomes,
        facts: FactsReader,
        breakers: Breakers,
        meters: DispatcherMeters,
        worker: str,
        lease_s: float,
        call_timeout_s: float,
        decide_timeout_s: float,
    ) -> None:
        self._rt, self._store, self._connectors = rt, store, connectors
        self._outcomes, self._facts, self._breakers = outcomes, facts, breakers
        self._attempts, self._rechecks = meters.attempts, meters.rechecks
        self._breaker_refused = meters.breaker_refused
        self._worker, self._lease_s = worker, lease_s
        self._call_timeout_s, self._decide_timeout_s = call_timeout_s, decide_timeout_s

    async def not_claimed(self, cmd: DispatchCommand) -> None:
        """A command this worker could not claim: a finished one's outcome again, else later."""
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

    async def execute(self, claim: Claim, delivery: Delivery[Any] | None) -> None:
        """Take a claimed command to its outcome, or give its lease back and raise to retry."""
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
            if connector.contract != "queryable":
                await self._rt.faults.reach("dispatcher.reconciling", claim.operation_id)
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
                found = await self.guarded(claim, delivery, connector.lookup(claim.action, key=key))
                await self._rt.faults.reach("dispatcher.reconciling", claim.operation_id)
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
        # The intent recorded, nothing sent.
        await self._rt.faults.reach("dispatcher.before_send", claim.operation_id)
        started = time.monotonic()
        result = await self.guarded(
            claim,
            delivery,
            connector.execute(
                claim.action,
                claim.arguments,
                key=key,
                expected_revision=claim.expected_revision,
                authorization=claim.authorization,
            ),
        )
        breaker.record(admission, self.outcome(result, time.monotonic() - started))
        await self._rt.faults.reach("dispatcher.after_remote_write", claim.operation_id)
        await self.conclude(claim, attempt, connector, result)

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
        await self._outcomes.of_claim(claim, state, receipt, reason)

    async def conclude(
        self, claim: Claim, attempt: int, connector: Connector, result: Result
    ) -> None:
        """End the command with the connector's result, or give the lease back and retry."""
        final = final_of(result, connector)
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

    async def guarded(
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

    def outcome(self, result: Result, elapsed_s: float) -> Outcome:
        """What a call's result means to its breaker (a call this side held up is neutral)."""
        return call_outcome(result.kind, elapsed_s=elapsed_s, timeout_s=self._call_timeout_s)

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
        await self._outcomes.of_claim(claim, state, receipt, reason)
