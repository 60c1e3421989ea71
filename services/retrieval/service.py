"""Retrieval: gathers tenant-scoped evidence for runs. Read-only, and everything it returns is
marked untrusted: a document that gives orders is still only a document."""

from __future__ import annotations

import anyio
import anyio.abc
import msgspec

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.runtime import Runtime
from schemas import subjects
from schemas.ingress import RunStarted
from schemas.retrieval import EvidenceGathered
from services.retrieval.store import RetrievalStore

__all__ = ["RetrievalService"]

INBOX = ConsumerSpec(stream="WRIT_INT", durable="retrieval",
                     filter_subjects=subjects.RETRIEVAL_IN)


class RetrievalService:
    """Answers each `RunStarted` with `EvidenceGathered`."""

    def __init__(self, *, rt: Runtime, store: RetrievalStore) -> None:
        self._rt, self._store = rt, store
        self._decoder = msgspec.json.Decoder(RunStarted)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume started runs until stopped."""
        await run_actor(js=self._rt.js, spec=INBOX, decoder=self._decoder, handler=self.handle,
                        metrics=self._rt.metrics, tracer=self._rt.tracer,
                        stopping=self._rt.stopping, task_status=task_status)

    async def handle(self, delivery: Delivery[RunStarted]) -> None:
        """Search the run's tenant's documents and hand the evidence to the planner."""
        run = delivery.message
        with self._rt.tracer.start_as_current_span("retrieval search") as span:
            evidence = await self._store.search(run.tenant, run.input)
            span.set_attribute("writ.evidence.count", len(evidence))
        await publish(
            self._rt.js, subjects.evidence(run.tenant),
            EvidenceGathered(run_id=run.run_id, request_id=run.request_id, tenant=run.tenant,
                             principal=run.principal, agent=run.agent, input=run.input,
                             evidence=evidence, attended=run.attended),
            msg_id=f"evidence:{run.run_id}",
        )
