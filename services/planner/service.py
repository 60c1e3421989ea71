"""Planner: the model loop. It proposes; it never acts and never holds a credential.

Each delivery advances one run under a row lock: record what arrived (evidence, an outcome, a
refusal), take the next model decision — reusing the recorded one if this step was already
decided — and publish what follows after the commit. A redelivery re-publishes the same messages
with the same `Nats-Msg-Id`, so nothing happens twice.

Each captured model response, tool output and status change is journaled with the step or status
it records (`store.py`); the planner also seals its journal and serves `writ.int.planner.replay`,
the offline replay of a run (`replay.py`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import anyio.abc
import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind
from prometheus_client import Counter

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from libs.telemetry import extract_context
from schemas import subjects
from schemas.admission import CommandAdmitted, ProposalRefused
from schemas.dispatcher import CommandOutcome
from schemas.host import ActionResult, ErrorInfo, ProposalView, RunResult
from schemas.planner import ProposeCommand, ReplayReport, ReplayRun
from schemas.retrieval import EvidenceGathered
from services.planner.provider import (
    AnswerDirectly,
    DecisionProvider,
    ModelDecision,
    SelectCapability,
)
from services.planner.replay import (
    REFUSAL_CODES,
    ProposalEntry,
    input_digest,
    model_input,
    observation_of,
    replay_run,
)
from services.planner.store import TERMINAL_RUN, PlannerStore, RunRow, Step

__all__ = ["PlannerService"]

INBOX = ConsumerSpec(stream="WRIT_INT", durable="planner", filter_subjects=subjects.PLANNER_IN)
Inbound = EvidenceGathered | CommandOutcome | CommandAdmitted | ProposalRefused
log = logging.getLogger("writ.planner")
_DECISION_DECODER = msgspec.json.Decoder(ModelDecision)
_RUN_RESULT_STATUSES = ("succeeded", "failed", "awaiting_human")
# (status, error code) of each run this delivery finished, counted once its commit is done.
_Finished = list[tuple[str, str | None]]


class PlannerService:
    """Drives runs from evidence to a final answer, one recorded step at a time."""

    def __init__(self, *, rt: Runtime, store: PlannerStore, provider: DecisionProvider,
                 max_decisions: int = 8, sealer: Sealer | None = None) -> None:
        self._rt, self._store, self._provider = rt, store, provider
        self._max_decisions, self._sealer = max_decisions, sealer
        self._replay_decoder = msgspec.json.Decoder(ReplayRun)
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Inbound)
        self._finished = Counter("writ_planner_runs_finished",
                                 "Runs that ended (or stopped for a person) with a result",
                                 ["status"], registry=rt.registry)
        for status in _RUN_RESULT_STATUSES:
            self._finished.labels(status)
        self._budget_exhausted = Counter("writ_planner_budget_exhaustions",
                                         "Runs failed for using up their model decisions",
                                         registry=rt.registry)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume evidence and outcomes, seal the journal and serve replays until stopped."""
        if self._store.journal is not None:
            self._rt.endpoints.append(Endpoint("replay", subjects.REPLAY, self._replay_endpoint,
                                               concurrency=8))
        async with anyio.create_task_group() as tg:
            if self._sealer is not None:
                await tg.start(self._sealer.run)  # chains and signs the audit journal
            await run_actor(js=self._rt.js, spec=INBOX, decoder=self._decoder,
                            handler=self.handle, metrics=self._rt.metrics,
                            tracer=self._rt.tracer, stopping=self._rt.stopping,
                            task_status=task_status)
            tg.cancel_scope.cancel()

    async def replay(self, ask: ReplayRun) -> ReplayReport | None:
        """Replay one run offline from the journal; None if the tenant has no such run."""
        entries, record, unsealed = await self._store.read_replay(ask.tenant, ask.run_id)
        if not entries and record is None:
            return None
        return replay_run(ask.run_id, entries, record=record, unsealed=unsealed)

    async def _replay_endpoint(self, request: Request) -> None:
        """`writ.int.planner.replay`: 400 undecodable, 404 no such run of the tenant."""
        started, metrics = time.perf_counter(), self._rt.metrics
        try:
            ask = self._replay_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            metrics.failed.labels("replay", "undecodable").inc()
            await request.respond_error("400", f"invalid ReplayRun: {exc}")
            return
        try:
            with self._rt.tracer.start_as_current_span(
                    "planner replay", context=extract_context(request.headers),
                    kind=SpanKind.SERVER):
                report = await self.replay(ask)
        except Exception as exc:
            metrics.failed.labels("replay", "error").inc()
            log.warning("replay failed: %r", exc)
            await request.respond_error("500", "replay failed")
            return
        if report is None:
            await request.respond_error("404", "no such run")
            return
        await request.respond(self._encoder.encode(report))
        metrics.handled.labels("replay").inc()
        metrics.latency.labels("replay").observe(time.perf_counter() - started)

    async def handle(self, delivery: Delivery[Inbound]) -> None:
        """Record what arrived and advance its run."""
        event = delivery.message
        if isinstance(event, CommandAdmitted):
            return  # progress, not a step: the outcome is what the model observes
        with self._rt.tracer.start_as_current_span("planner step") as span:
            span.set_attribute("writ.run_id", event.run_id)
            if isinstance(event, EvidenceGathered):
                await self._store.create_run(event)
            elif not await self._store.exists(event.run_id):
                return  # an outcome for a run this planner never started: nothing to drive
            finished: _Finished = []
            effects = await self._advance(event, finished)
        # Committed: count each run's end once. A redelivery re-publishes a terminal run's
        # result through the replay path, which finishes nothing and is not counted again.
        for status, code in finished:
            self._finished.labels(status).inc()
            if code == "BUDGET_EXHAUSTED":
                self._budget_exhausted.inc()
        for subject, message, msg_id in effects:
            await publish(self._rt.js, subject, message, msg_id=msg_id)

    async def _advance(self, event: Inbound, finished: _Finished
                       ) -> list[tuple[str, msgspec.Struct, str]]:
        async with self._store.acquire() as conn, conn.transaction():
            run = await self._store.lock_run(conn, event.run_id)
            if run is None:
                return []  # an outcome for a run this planner never started: nothing to drive
            steps = await self._store.steps(conn, run.run_id)
            # An ask is not an observation: the step's observation is what the answer leads to.
            if isinstance(event, CommandOutcome) or (
                    isinstance(event, ProposalRefused) and event.verdict != "ask"):
                observation = observation_of(event)
                if await self._store.add_observation(
                        conn, run, event.step + 1, step=event.step,
                        output=msgspec.to_builtins(event), observation=observation):
                    steps.append(Step(seq=event.step + 1, kind="observation",
                                      payload=observation))
            if run.status in TERMINAL_RUN:
                return [self._result(run, steps)]
            if isinstance(event, ProposalRefused):
                return await self._refused(conn, run, steps, event, finished)
            if run.status == "awaiting_human":
                if not isinstance(event, CommandOutcome):
                    return []  # still waiting for the person
                # The person said yes and the command ran: the run goes on from here.
                await self._store.set_status(conn, run, "running", step=event.step)
                run = msgspec.structs.replace(run, status="running", error_code=None,
                                              error_message=None)
            last = steps[-1] if steps else None
            if last is not None and last.kind == "decision":
                decision = _DECISION_DECODER.decode(msgspec.json.encode(last.payload))
            else:
                decisions = sum(1 for s in steps if s.kind == "decision")
                if decisions >= self._max_decisions:
                    return [await self._finish(conn, run, steps, "failed", finished,
                                               error=("BUDGET_EXHAUSTED",
                                                      f"{decisions} model decisions"))]
                decision = await self._decide(conn, run, steps, turn=decisions)
                last = steps[-1]
            if isinstance(decision, AnswerDirectly):
                return [await self._finish(conn, run, steps, "succeeded", finished,
                                           answer=decision.answer, step=last.seq)]
            return [(subjects.proposal(run.tenant), _proposal(run, last.seq, decision),
                     f"proposal:{run.run_id}:{last.seq}")]

    async def _decide(self, conn: Any, run: RunRow, steps: list[Step], *,
                      turn: int) -> ModelDecision:
        """Ask the model, and record its response with the proposal it becomes, journaled."""
        value = model_input(user=run.input, evidence=run.evidence,
                            observations=[s.payload for s in steps if s.kind == "observation"],
                            turn=turn, agent=run.agent)
        digest = input_digest(value)
        with self._rt.tracer.start_as_current_span("planner model") as span:
            span.set_attribute("writ.model_input.sha256", digest)
            decision = await self._provider.decide(value)
        seq = steps[-1].seq + 1 if steps else 0
        payload = msgspec.to_builtins(decision)
        proposal = None
        if not isinstance(decision, AnswerDirectly):
            command = _proposal(run, seq, decision)
            proposal = ProposalEntry(step=seq, action=command.action,
                                     arguments=command.arguments)
        await self._store.add_decision(conn, run, seq, payload, turn=turn, input_digest=digest,
                                       proposal=proposal)
        steps.append(Step(seq=seq, kind="decision", payload=payload))
        return decision

    async def _refused(self, conn: Any, run: RunRow, steps: list[Step],
                       event: ProposalRefused,
                       finished: _Finished) -> list[tuple[str, msgspec.Struct, str]]:
        if event.verdict == "ask":
            message = f"{event.action} needs a person's decision: {event.reason}"
            await self._store.set_status(conn, run, "awaiting_human", step=event.step,
                                         error_code="AWAITING_HUMAN", error_message=message)
            if run.attended:
                return []  # someone is watching: the run waits for their answer
            # Unattended runs never wait: the run stops here and lists the pending decision.
            if run.status != "awaiting_human":  # not the same ask delivered again
                finished.append(("awaiting_human", "AWAITING_HUMAN"))
            run = msgspec.structs.replace(run, status="awaiting_human",
                                          error_code="AWAITING_HUMAN", error_message=message)
            proposal = None
            if event.proposal_id is not None:
                proposal = ProposalView(proposal_id=event.proposal_id, action=event.action,
                                        preview=event.preview or {},
                                        expires_at=event.expires_at or "")
            return [self._result(run, steps, pending_id=event.pending_id, proposal=proposal)]
        # A refusal fails the run; the agent is not called again for it.
        return [await self._finish(conn, run, steps, "failed", finished, step=event.step,
                                   error=(REFUSAL_CODES[event.verdict], event.reason))]

    async def _finish(self, conn: Any, run: RunRow, steps: list[Step], status: str,
                      finished: _Finished, *, answer: str | None = None,
                      error: tuple[str, str] | None = None,
                      step: int | None = None) -> tuple[str, msgspec.Struct, str]:
        code, message = error if error else (None, None)
        await self._store.set_status(conn, run, status, step=step, answer=answer,
                                     error_code=code, error_message=message)
        finished.append((status, code))
        run = msgspec.structs.replace(run, status=status, answer=answer, error_code=code,
                                      error_message=message)
        return self._result(run, steps)

    def _result(self, run: RunRow, steps: list[Step], *, pending_id: str | None = None,
                proposal: ProposalView | None = None) -> tuple[str, msgspec.Struct, str]:
        actions = [_action_result(s.payload)
                   for s in steps if s.kind == "observation" and "operation_id" in s.payload]
        error = (ErrorInfo(code=run.error_code, message=(run.error_message or "")[:512])
                 if run.error_code else None)
        status = run.status if run.status in ("succeeded", "failed", "awaiting_human") else "failed"
        result = RunResult(request_id=run.request_id, run_id=run.run_id, status=status,
                           error=error, answer=run.answer, actions=actions,
                           pending_id=pending_id, proposal=proposal)
        return (subjects.result(run.tenant), result,
                f"result:{run.run_id}:{run.status}:{len(steps)}")


def _proposal(run: RunRow, step: int, decision: SelectCapability) -> ProposeCommand:
    return ProposeCommand(run_id=run.run_id, step=step, tenant=run.tenant,
                          principal=run.principal, agent=run.agent,
                          action=decision.capability[:512], arguments=decision.arguments)


def _action_result(payload: dict[str, Any]) -> ActionResult:
    return ActionResult(action=payload["action"], operation_id=payload["operation_id"],
                        state=payload["state"], receipt=payload.get("receipt"),
                        reason=payload.get("reason"), outcome=payload.get("outcome"),
                        correlation_id=payload.get("correlation_id"))
