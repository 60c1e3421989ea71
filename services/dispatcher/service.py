"""Dispatcher: the only process with connector credentials. It executes admitted commands.

It claims a command under a fenced lease, re-checks it, calls the connector with the operation
id as the idempotency key, records the attempt and the outcome, and only then acks (DESIGN.md §5).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

import anyio
import anyio.abc
import msgspec

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.errors import PermanentError, RetryableError
from libs.runtime import Runtime
from schemas import subjects
from schemas.actions import ACTIONS
from schemas.admission import DispatchCommand
from schemas.dispatcher import CommandOutcome
from services.dispatcher.connectors import Connector
from services.dispatcher.store import TERMINAL, Claim, DispatcherStore

__all__ = ["DispatcherService"]

log = logging.getLogger("writ.dispatcher")


def inbox(ack_wait_s: float) -> ConsumerSpec:
    """The dispatch consumer; its `ack_wait` is the lease's clock."""
    return ConsumerSpec(stream="WRIT_CMD", durable="dispatcher",
                        filter_subjects=subjects.DISPATCH_IN, ack_wait_s=ack_wait_s,
                        max_deliver=20)


class DispatcherService:
    """Executes each admitted command at most once per lease, exactly once where it can."""

    def __init__(self, *, rt: Runtime, store: DispatcherStore,
                 connectors: dict[str, Connector], lease_s: float = 30.0,
                 worker: str | None = None) -> None:
        self._rt, self._store, self._connectors = rt, store, connectors
        self._lease_s = lease_s
        self._worker = worker or f"dispatcher-{uuid.uuid4().hex[:8]}"
        self._decoder = msgspec.json.Decoder(DispatchCommand)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume admitted commands until stopped."""
        await run_actor(js=self._rt.js, spec=inbox(self._lease_s), decoder=self._decoder,
                        handler=self.handle, metrics=self._rt.metrics, tracer=self._rt.tracer,
                        stopping=self._rt.stopping, ack_sync=True, task_status=task_status)

    async def handle(self, delivery: Delivery[DispatchCommand]) -> None:
        """Claim, check, execute, record; raising `Fenced` leaves the delivery untouched."""
        cmd = delivery.message
        with self._rt.tracer.start_as_current_span("dispatch") as span:
            span.set_attribute("writ.operation_id", cmd.operation_id)
            claim = await self._store.claim(cmd.tenant, cmd.operation_id, worker=self._worker,
                                            lease_s=self._lease_s)
            if claim is None:
                await self._not_claimed(cmd)
                return
            await self._execute(claim)

    async def _not_claimed(self, cmd: DispatchCommand) -> None:
        current = await self._store.current(cmd.tenant, cmd.operation_id)
        if current is None:
            raise PermanentError(f"no command {cmd.tenant}:{cmd.operation_id}")
        if current.state in TERMINAL:
            # Delivered again after the end: answer with the recorded outcome, do nothing else.
            await self._publish_outcome(cmd.tenant, cmd.operation_id, current.run_id,
                                        current.step, current.action, current.state,
                                        current.receipt, current.reason)
            return
        remaining = 1.0
        if current.lease_until is not None:
            remaining = (current.lease_until - datetime.now(UTC)).total_seconds()
        raise RetryableError("another worker holds the lease", delay=max(remaining, 0.5))

    async def _execute(self, claim: Claim) -> None:
        contract = ACTIONS.get(claim.action)
        if contract is None or contract.connector not in self._connectors:
            await self._finish(claim, None, state="failed", result="failed", receipt=None,
                               reason=f"no connector for {claim.action}")
            return
        if claim.expires_at <= datetime.now(UTC):
            await self._finish(claim, None, state="expired", result="failed", receipt=None,
                               reason="the approval expired before dispatch")
            return
        connector = self._connectors[contract.connector]
        attempt = await self._store.start_attempt(claim, worker=self._worker,
                                                  connector=connector.name)
        result = await connector.execute(claim.action, claim.arguments,
                                         key=f"{claim.tenant}:{claim.operation_id}",
                                         expected_revision=claim.expected_revision)
        if result.kind == "succeeded":
            await self._finish(claim, attempt, state="succeeded", result="succeeded",
                               receipt=result.receipt, reason=None)
        elif result.kind == "rejected":
            await self._finish(claim, attempt, state="failed", result="failed", receipt=None,
                               reason=result.detail)
        elif result.kind == "revision_mismatch":
            await self._finish(claim, attempt, state="revision_required",
                               result="revision_required", receipt=None, reason=result.detail)
        elif result.kind == "transient" or (result.kind == "lost"
                                             and connector.contract == "idempotent"):
            # Nothing happened, or the provider dedupes the key: replay the same request later.
            await self._store.release(claim, attempt, result=result.kind, detail=result.detail)
            raise RetryableError(f"{connector.name}: {result.detail}")
        else:
            # A lost response from a provider that cannot prove what happened: say so.
            await self._finish(claim, attempt, state="unknown", result="lost", receipt=None,
                               reason=result.detail)

    async def _finish(self, claim: Claim, attempt: int | None, *, state: str, result: str,
                      receipt: str | None, reason: str | None) -> None:
        if attempt is None:
            attempt = await self._store.start_attempt(claim, worker=self._worker,
                                                      connector="none")
        await self._store.finish(claim, attempt, state=state, result=result, receipt=receipt,
                                 reason=reason)
        await self._publish_outcome(claim.tenant, claim.operation_id, claim.run_id, claim.step,
                                    claim.action, state, receipt, reason)

    async def _publish_outcome(self, tenant: str, operation_id: str, run_id: str, step: int,
                               action: str, state: str, receipt: str | None,
                               reason: str | None) -> None:
        await publish(
            self._rt.js, subjects.outcome(tenant),
            CommandOutcome(tenant=tenant, operation_id=operation_id, run_id=run_id, step=step,
                           action=action, state=state, receipt=receipt,
                           reason=(reason or "")[:500] or None),
            msg_id=f"outcome:{tenant}:{operation_id}",
        )
