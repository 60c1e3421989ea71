"""Ingress: authenticates hosts' requests and starts runs. It holds issuers' public keys only."""

from __future__ import annotations

import anyio
import anyio.abc

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.runtime import Runtime
from schemas import subjects
from schemas.host import CommandResult, ErrorInfo, RunResult, SubmitCommand
from schemas.ingress import RunStarted
from schemas.planner import ProposeCommand
from services.ingress.logic import (
    COMMAND_DECODER,
    REQUEST_DECODER,
    Rejection,
    TenantKey,
    Verified,
    command_run_id,
    verify_request,
)

__all__ = ["IngressService"]

INBOX = ConsumerSpec(stream="WRIT_IN", durable="ingress", filter_subjects=subjects.INGRESS_IN)


class IngressService:
    """Verifies each `RunRequest` and publishes `RunStarted`, or a rejection to the host."""

    def __init__(self, *, rt: Runtime, keys: dict[str, TenantKey], audience: str,
                 max_request_bytes: int) -> None:
        self._rt, self._keys = rt, keys
        self._audience, self._max_bytes = audience, max_request_bytes

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume the host request stream until stopped."""
        await run_actor(js=self._rt.js, spec=INBOX, decoder=None, handler=self.handle,
                        metrics=self._rt.metrics, tracer=self._rt.tracer,
                        stopping=self._rt.stopping, task_status=task_status)

    async def handle(self, delivery: Delivery[bytes]) -> None:
        """Verify one request or command; pass it on, or tell the host why not."""
        tenant = delivery.subject.rsplit(".", 1)[-1]
        is_command = delivery.subject.startswith("writ.in.commands.")
        with self._rt.tracer.start_as_current_span("ingress verify") as span:
            outcome = verify_request(
                delivery.message, subject_tenant=tenant,
                header_request_id=delivery.headers.get("Nats-Msg-Id"), keys=self._keys,
                audience=self._audience, max_bytes=self._max_bytes,
                decoder=COMMAND_DECODER if is_command else REQUEST_DECODER,
            )
            span.set_attribute("writ.verified", not isinstance(outcome, Rejection))
        if isinstance(outcome, Rejection):
            seq = delivery.msg.metadata.sequence.stream
            error = ErrorInfo(code=outcome.code, message=outcome.message[:512])
            rejection: RunResult | CommandResult = (
                CommandResult(request_id=outcome.request_id, operation_key="",
                              status="rejected", error=error) if is_command else
                RunResult(request_id=outcome.request_id, status="rejected", error=error))
            await publish(self._rt.js, subjects.result(tenant), rejection,
                          msg_id=f"rejected:{tenant}:{seq}")
            return
        request = outcome.request
        if isinstance(request, SubmitCommand):
            await self._submit(outcome, request)
            return
        await publish(
            self._rt.js, subjects.run_started(tenant),
            RunStarted(run_id=outcome.run_id, request_id=request.request_id, tenant=tenant,
                       principal=outcome.principal, agent=request.agent, input=request.input),
            msg_id=f"run-started:{outcome.run_id}",
        )

    async def _submit(self, outcome: Verified, command: SubmitCommand) -> None:
        # A host's own command skips the planner: straight to admission's contract checks.
        await publish(
            self._rt.js, subjects.proposal(outcome.tenant),
            ProposeCommand(run_id=command_run_id(outcome.tenant, command.operation_key), step=0,
                           tenant=outcome.tenant, principal=outcome.principal,
                           agent=command.agent, action=command.action,
                           arguments=command.arguments,
                           expected_revision=command.expected_revision,
                           operation_key=command.operation_key,
                           request_id=command.request_id),
            msg_id=f"submitted:{outcome.tenant}:{command.request_id}",
        )
