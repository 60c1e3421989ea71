"""Ingress: authenticates hosts' requests and starts runs. It holds issuers' public keys only."""

from __future__ import annotations

import anyio
import anyio.abc

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.runtime import Runtime
from schemas import subjects
from schemas.host import ErrorInfo, RunResult
from schemas.ingress import RunStarted
from services.ingress.logic import Rejection, TenantKey, verify_request

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
        """Verify one request; either start its run or tell the host why not."""
        tenant = delivery.subject.rsplit(".", 1)[-1]
        with self._rt.tracer.start_as_current_span("ingress verify") as span:
            outcome = verify_request(
                delivery.message, subject_tenant=tenant,
                header_request_id=delivery.headers.get("Nats-Msg-Id"), keys=self._keys,
                audience=self._audience, max_bytes=self._max_bytes,
            )
            span.set_attribute("writ.verified", not isinstance(outcome, Rejection))
        if isinstance(outcome, Rejection):
            seq = delivery.msg.metadata.sequence.stream
            await publish(
                self._rt.js, subjects.result(tenant),
                RunResult(request_id=outcome.request_id, status="rejected",
                          error=ErrorInfo(code=outcome.code, message=outcome.message)),
                msg_id=f"rejected:{tenant}:{seq}",
            )
            return
        request = outcome.request
        await publish(
            self._rt.js, subjects.run_started(tenant),
            RunStarted(run_id=outcome.run_id, request_id=request.request_id, tenant=tenant,
                       principal=outcome.principal, agent=request.agent, input=request.input),
            msg_id=f"run-started:{outcome.run_id}",
        )
