"""Governance: answers `decide` over request/reply. It holds the rule store, nothing that acts."""

from __future__ import annotations

import logging
import time
import uuid

import anyio
import anyio.abc
import msgspec
from nats.micro.request import Request

from libs.runtime import Endpoint, Runtime
from schemas import subjects
from schemas.actions import ACTIONS
from schemas.governance import DecideRequest, Decision
from services.governance.logic import SENSITIVE_UNREADABLE, Call, decide
from services.governance.store import GovernanceStore

__all__ = ["GovernanceService"]

log = logging.getLogger("writ.governance")


class GovernanceService:
    """Decides capability calls; an unreadable store denies every sensitive call."""

    def __init__(self, *, rt: Runtime, store: GovernanceStore) -> None:
        self._rt, self._store = rt, store
        self._decoder = msgspec.json.Decoder(DecideRequest)
        self._encoder = msgspec.json.Encoder()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve `decide` until stopped."""
        self._rt.endpoints.append(Endpoint("decide", subjects.DECIDE, self._on_request))
        task_status.started()
        await self._rt.stopping.wait()

    async def _on_request(self, request: Request) -> None:
        metrics, started = self._rt.metrics, time.perf_counter()
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            metrics.failed.labels("decide", "undecodable").inc()
            await request.respond_error("400", f"invalid DecideRequest: {exc}")
            return
        decision = await self.decide(ask)
        await request.respond(self._encoder.encode(decision))
        metrics.handled.labels("decide").inc()
        metrics.latency.labels("decide").observe(time.perf_counter() - started)

    async def decide(self, ask: DecideRequest) -> Decision:
        """Decide one call and record the decision."""
        contract = ACTIONS.get(ask.tool)
        call = Call(tool=ask.tool, family=contract.family if contract else None,
                    connector=contract.connector if contract else None, agent=ask.agent,
                    first_argument=ask.first_argument)
        with self._rt.tracer.start_as_current_span("governance decide") as span:
            try:
                facts = await self._store.facts(ask.tenant, call, ask.principal)
            except Exception as exc:  # any failure to read is a failure to know: fail closed
                log.warning("governance store unreadable: %r", exc)
                facts = None
            ruling = decide(call, facts)
            policy_version = facts.policy_version if facts else "unreadable"
            span.set_attribute("writ.decision.verdict", ruling.verdict)
            span.set_attribute("writ.decision.line", ruling.line)
            try:
                decision_id = await self._store.record(
                    tenant=ask.tenant, run_id=ask.run_id, principal=ask.principal, call=call,
                    ruling=ruling, policy_version=policy_version)
            except Exception as exc:
                # An allow nobody can find later is not an allow: deny what we cannot record.
                log.warning("cannot record decision: %r", exc)
                decision_id = str(uuid.uuid4())
                if ruling.verdict != "deny" and call.family != "read":
                    ruling = decide(call, None)
                    ruling = msgspec.structs.replace(ruling, reason=SENSITIVE_UNREADABLE)
        return Decision(decision_id=decision_id, verdict=ruling.verdict, line=ruling.line,
                        family=call.family or "unclassified", reason=ruling.reason,
                        policy_version=policy_version)
