"""The facts a plan's steps stand on, kept when the plan is proposed
(`writ.int.admission.plan_facts`).

A chat turn's plan freezes each step's request before any of it reaches admission; a plan the
user rejects never does, and a planned selection is judged by a shadow evaluation before the
approved step is taken. So when the planner freezes a plan it asks admission for the facts of
its steps: admission decodes each step's request with its contract as it would decode the
proposal, reads the facts the contract names (`libs.facts.read_facts`, the readers admission
asks for a proposal) and keeps them in `admission.resolved_facts` — the record `writ eval`
already reads — under the planned selection's run and step, with an id of their own
(`plan_step_id_for`): a plan's step never takes or overwrites a proposal's row, whatever step
it names.
It answers with what it read, which the planner resolves the plan's previews from: what the
user is shown and what the evaluation judges against are one read.

Admission reads the facts itself: the planner, the service nearest the model, asks for a step
but never writes what admission's record says it stood on. A step that does not decode, or
stands on no facts, is left out (admission would refuse or need nothing for it). 503: a reader
did not answer (the planner retries; no plan is shown before its facts are kept), 400: an
undecodable ask.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.micro.request import Request

from actions.base import Invalid
from libs.errors import RetryableError
from libs.facts import read_facts
from libs.runtime import Endpoint
from schemas.admission import PlanFactsRecorded, PlannedStepFacts, RecordPlanFacts
from schemas.subjects import PLAN_FACTS
from services.admission._rows import ResolvedFacts
from services.admission.logic import decode_request, plan_step_id_for
from services.admission.store import AdmissionStore

__all__ = ["PlanFactsEndpoint"]

log = logging.getLogger("writ.admission")
_DECODER: Final = msgspec.json.Decoder(RecordPlanFacts)
_ENCODER: Final = msgspec.json.Encoder()


class PlanFactsEndpoint:
    """Reads and keeps the facts of a proposed plan's steps."""

    def __init__(self, store: AdmissionStore, nc: Client, *, timeout_s: float = 5.0) -> None:
        self._store, self._nc, self._timeout = store, nc, timeout_s

    def endpoint(self) -> Endpoint:
        """The endpoint, to serve with the process's micro service."""
        return Endpoint("plan_facts", PLAN_FACTS, self._serve)

    async def _serve(self, request: Request) -> None:
        try:
            ask = _DECODER.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid RecordPlanFacts: {exc}"[:500])
            return
        try:
            reply = await self.record(ask)
        except RetryableError as exc:
            await request.respond_error("503", f"the facts could not be read now: {exc}"[:500])
            return
        await request.respond(_ENCODER.encode(reply))

    async def record(self, ask: RecordPlanFacts) -> PlanFactsRecorded:
        """Read each facts-bound step's facts (each resource once), keep them, and say what
        was read.

        Raises:
            RetryableError: a reader did not answer; nothing is kept.
        """
        read: dict[tuple[str, str], tuple[dict[str, Any] | None, datetime]] = {}
        rows: list[ResolvedFacts] = []
        out: list[PlannedStepFacts] = []
        for step in ask.steps:
            try:
                contract, typed = decode_request(
                    step.capability.removeprefix("action:"), step.request
                )
            except (Invalid, msgspec.ValidationError):
                continue
            ref = contract.facts_ref(typed)
            if ref is None:
                continue
            if (ref.kind, ref.id) not in read:
                facts = await read_facts(
                    self._nc, ask.tenant, ref.kind, ref.id, timeout=self._timeout
                )
                read[(ref.kind, ref.id)] = (facts, datetime.now(UTC))
            facts, read_at = read[(ref.kind, ref.id)]
            out.append(PlannedStepFacts(step=step.step, found=facts is not None, facts=facts))
            if facts is not None:
                rows.append(
                    ResolvedFacts(
                        tenant=ask.tenant,
                        proposal_id=plan_step_id_for(ask.tenant, ask.run_id, step.step),
                        run_id=ask.run_id,
                        step=step.step,
                        action=contract.name,
                        kind=ref.kind,
                        ref=ref.id,
                        facts=facts,
                        read_at=read_at,
                    )
                )
        await self._store.record_resolved_facts(rows)
        log.info("run %s: kept the facts of %d planned steps", ask.run_id, len(rows))
        return PlanFactsRecorded(steps=out)
