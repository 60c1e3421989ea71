"""Planner: the model loop. It proposes; it never acts and never holds a credential.

Each delivery advances one run under a row lock: record what arrived (evidence, an outcome, a
refusal), take the next model decision — reusing the recorded one if this step was already
decided — and publish what follows after the commit. A redelivery re-publishes the same messages
with the same `Nats-Msg-Id`, so nothing happens twice.

The decision protocol (seed 004, `protocol.py`): a run starts only for an agent a manifest
declares and that takes work (`agents.py`); its model first sees a summary of the agent's
capabilities and the catalog once it asked (`request_capabilities`); a `select_capability` is
checked before any handler runs (in `uses`, `callable_by`, the arguments against the target's
signature), and a refusal is recorded as the observation the next decision reads, never executed;
a checked selection of an action is proposed to admission, one of a read tool is read by
retrieval (`reads.py`: request/reply on `writ.int.retrieval.read`, after governance's `decide`
there) and its answer — the items, untrusted and bounded, or why nothing was read — is the next
observation (a read a person must allow is observed as not read: the run does not wait for it);
a checked selection of another agent is decided by governance and, if allowed, runs as a branch
of the run (`branches.py`): a run of its own, started with a `BranchChanged` to this inbox, whose
end wakes the caller with another, and is observed by it (the answer, untrusted and bounded);
a `request_human_review` stops the run as `awaiting_human` until a person answers
(`writ.int.planner.review`). Each decision and observation is committed as a step before the
next decision is asked for.

Budgets (DESIGN.md invariant 9, `budgeting.py`): every provider call (a decision, a critic's
verdict) first reserves a provider call and tokens of the run's budget in governance, and every
capability call (a checked selection proposed to admission, or read by retrieval) a capability
call; each is settled with what it used. A budget that ran out stops the run in code — `failed` with
`BUDGET_EXHAUSTED` naming the budget — and the model is not asked whether to continue.

The critic (seed 000 scenario A): for an agent whose manifest has one, an `answer_directly` is
verified against the objective before the run ends with it; `replan` feeds the critic's reason
back as an observation written by Writ and the agent decides again, under the same budgets.

Each captured model response, tool output (a read's answer included) and status change is
journaled with the step or status it records (`store.py`); the planner also seals its journal and
serves `writ.int.planner.replay`, the offline replay of a run (`replay.py`). Each committed step
is announced on core NATS `writ.events.planner.<tenant>` (`progress.py`), for those who watch.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import anyio
import anyio.abc
import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind
from prometheus_client import Counter

from libs.actor import Delivery, run_actor
from libs.budget import BudgetExhausted, NoBudget
from libs.bus import ConsumerSpec, publish
from libs.errors import PermanentError, RetryableError
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from libs.telemetry import extract_context
from schemas import subjects
from schemas.admission import CommandAdmitted, ProposalRefused
from schemas.dispatcher import CommandOutcome
from schemas.host import ActionResult, ErrorInfo, ProposalView, RunResult
from schemas.planner import (
    REVIEW,
    BranchChanged,
    ProposeCommand,
    ReplayReport,
    ReplayRun,
    ReviewAnswer,
)
from schemas.retrieval import EvidenceGathered, ReadCapability, ReadRefused
from services.planner.agents import AgentRegistry
from services.planner.branches import CallDecider, branch_run, branch_run_id
from services.planner.budgeting import RunBudgets, step_key
from services.planner.progress import step_recorded
from services.planner.protocol import action_name
from services.planner.provider import (
    Accept,
    AnswerDirectly,
    DecisionProvider,
    ModelDecision,
    RequestCapabilities,
    RequestHumanReview,
    SelectCapability,
)
from services.planner.reads import ReadClient
from services.planner.replay import (
    BUDGET_CODE,
    REFUSAL_CODES,
    REVIEW_CODE,
    AgentObserved,
    CriticReplan,
    ProposalEntry,
    ReadObserved,
    ReviewAnswered,
    SelectionRefused,
    agent_call_target,
    branch_of,
    critic_input,
    has_critic,
    input_digest,
    model_input,
    observation_of,
    read_target,
    replay_run,
    selection_outcome,
)
from services.planner.store import TERMINAL_RUN, PlannerStore, RunRow, Step

__all__ = ["PlannerService"]

INBOX = ConsumerSpec(stream="WRIT_INT", durable="planner", filter_subjects=subjects.PLANNER_IN)
Inbound = EvidenceGathered | CommandOutcome | CommandAdmitted | ProposalRefused | BranchChanged
log = logging.getLogger("writ.planner")
_DECISION_DECODER = msgspec.json.Decoder(ModelDecision)
_RUN_RESULT_STATUSES = ("succeeded", "failed", "awaiting_human")
# (status, error code) of each run this delivery finished, counted once its commit is done.
_Finished = list[tuple[str, str | None]]
_Effects = list[tuple[str, msgspec.Struct, str]]
_AGAIN: Final = None  # `_next` took a decision the runtime answers itself: decide again
_READ_OUTCOMES: Final = ("read", "unknown_tool", "invalid_arguments", "denied", "ask")
_CALL_OUTCOMES: Final = ("answered", "failed", "awaiting_human", "denied", "ask",
                         "unknown_agent")


class _ReviewRefused(Exception):
    """A review answer that does not fit the run (no such review waiting)."""


class _Undescribed(Exception):
    """A capability of the run's catalog has no description: no model call is made."""


class PlannerService:
    """Drives runs from evidence to a final answer, one recorded step at a time."""

    def __init__(self, *, rt: Runtime, store: PlannerStore, provider: DecisionProvider,
                 agents: AgentRegistry, max_decisions: int = 8,
                 reserve_tokens: int = 4096, sealer: Sealer | None = None,
                 reads: ReadClient | None = None, calls: CallDecider | None = None) -> None:
        self._rt, self._store, self._provider = rt, store, provider
        self._reads = reads if reads is not None else ReadClient(nc=rt.nc)
        self._calls = calls if calls is not None else CallDecider(nc=rt.nc)
        self._agents = agents
        # What a provider call reserves of the run's tokens before it starts (settled with
        # what the provider reports it used).
        self._reserve_tokens = reserve_tokens
        self._budget = RunBudgets(nc=rt.nc, store=store)
        self._max_decisions, self._sealer = max_decisions, sealer
        self._replay_decoder = msgspec.json.Decoder(ReplayRun)
        self._review_decoder = msgspec.json.Decoder(ReviewAnswer)
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Inbound)
        self._finished = Counter("writ_planner_runs_finished",
                                 "Runs that ended (or stopped for a person) with a result",
                                 ["status"], registry=rt.registry)
        for status in _RUN_RESULT_STATUSES:
            self._finished.labels(status)
        self._selections_refused = Counter("writ_planner_selections_refused",
                                "Selections refused before any handler ran", ["check"],
                                registry=rt.registry)
        for check in ("uses", "callable_by", "arguments", "depth", "cycle", "unsupported"):
            self._selections_refused.labels(check)
        self._reads_observed = Counter("writ_planner_reads",
                                       "Reads by retrieval observed by a run, by outcome (a "
                                       "read that may succeed later is retried, not counted)",
                                       ["outcome"], registry=rt.registry)
        for outcome in _READ_OUTCOMES:
            self._reads_observed.labels(outcome)
        self._agent_calls = Counter("writ_planner_agent_calls",
                                    "Calls to other agents observed by a run, by how they "
                                    "ended (or why they never started)", ["outcome"],
                                    registry=rt.registry)
        for outcome in _CALL_OUTCOMES:
            self._agent_calls.labels(outcome)
        # Label-free: which budget ran out is governance's writ_governance_budget_exhausted
        # (by `budget`) and the run's error message; this counts the runs the planner stopped.
        self._budget_exhausted = Counter("writ_planner_budget_exhaustions",
                                         "Runs the planner stopped because a budget ran out "
                                         "(its own decision cap included)",
                                         registry=rt.registry)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Consume evidence and outcomes, seal the journal and serve replays until stopped."""
        if self._store.journal is not None:
            self._rt.endpoints.append(Endpoint("replay", subjects.REPLAY, self._replay_endpoint,
                                               concurrency=8))
        self._rt.endpoints.append(Endpoint("review", REVIEW, self._review_endpoint,
                                           concurrency=8))
        try:
            async with anyio.create_task_group() as tg:
                if self._sealer is not None:
                    await tg.start(self._sealer.run)  # chains and signs the audit journal
                await run_actor(js=self._rt.js, spec=INBOX, decoder=self._decoder,
                                handler=self.handle, metrics=self._rt.metrics,
                                tracer=self._rt.tracer, stopping=self._rt.stopping,
                                task_status=task_status)
                tg.cancel_scope.cancel()
        finally:
            self._agents.stop_all()

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
                agent = self._agents.get(event.agent)
                snapshot = None if agent is None else {
                    "name": agent.name, "version": agent.manifest.version,
                    "responsibility": agent.manifest.responsibility, "catalog": agent.catalog,
                    "critic": agent.manifest.critic}
                await self._store.create_run(event, manifest=snapshot)
            elif not await self._store.exists(event.run_id):
                return  # an outcome for a run this planner never started: nothing to drive
            finished: _Finished = []
            effects = await self._advance(event, finished)
        await self._committed(finished, effects)

    async def _committed(self, finished: _Finished, effects: _Effects) -> None:
        # Committed: count each run's end once. A redelivery re-publishes a terminal run's
        # result through the replay path, which finishes nothing and is not counted again.
        for status, code in finished:
            self._finished.labels(status).inc()
            if code == BUDGET_CODE:
                self._budget_exhausted.inc()
        if any(isinstance(m, ProposeCommand) for _, m, _ in effects):
            # Armed by the fault suite: the decision and its reservation are committed, the
            # proposal is not published yet (the redelivery publishes it, the model unasked).
            self._rt.faults.crash_if("planner.before_proposal")
        for subject, message, msg_id in effects:
            await publish(self._rt.js, subject, message, msg_id=msg_id)

    async def _advance(self, event: Inbound, finished: _Finished) -> _Effects:
        async with self._store.acquire() as conn, conn.transaction():
            run = await self._store.lock_run(conn, event.run_id)
            if run is None:
                return []  # an outcome for a run this planner never started: nothing to drive
            steps = await self._store.steps(conn, run.run_id)
            seen = len(steps)
            effects = await self._advance_run(conn, run, steps, event, finished)
        await self._announce(run, steps[seen:])
        return await self._continue(run.run_id, effects, finished)

    async def _advance_run(self, conn: Any, run: RunRow, steps: list[Step], event: Inbound,
                           finished: _Finished) -> _Effects | None:
        await self._budget.settle_due(conn, run)
        # An ask is not an observation: the step's observation is what the answer leads to.
        if isinstance(event, CommandOutcome) or (
                isinstance(event, ProposalRefused) and event.verdict != "ask"):
            observation = observation_of(event)
            if await self._store.add_observation(
                    conn, run, event.step + 1, step=event.step,
                    output=msgspec.to_builtins(event), observation=observation):
                steps.append(Step(seq=event.step + 1, kind="observation",
                                  payload=observation))
            # The capability call has its outcome (or its refusal): it is over.
            await self._budget.spent(conn, run, step_key(run.run_id, event.step,
                                                         "capability"), capability_calls=1)
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
        if not steps and (refusal := self._agent_refusal(run)) is not None:
            return [await self._finish(conn, run, steps, "failed", finished, error=refusal)]
        return await self._next(conn, run, steps, finished)

    async def _continue(self, run_id: str, effects: _Effects | None,
                        finished: _Finished) -> _Effects:
        """Take the decisions the runtime answers itself, each in its own transaction, so each
        step is committed before the next decision is asked for."""
        while effects is _AGAIN:
            # Armed by the fault suite: a step (a model decision) is committed and nothing
            # that follows it has started.
            self._rt.faults.crash_if("planner.after_decision")
            async with self._store.acquire() as conn, conn.transaction():
                run = await self._store.lock_run(conn, run_id)
                if run is None or run.status != "running":
                    return []
                steps = await self._store.steps(conn, run_id)
                seen = len(steps)
                effects = await self._next(conn, run, steps, finished)
            await self._announce(run, steps[seen:])
        return effects

    async def _announce(self, run: RunRow, steps: list[Step]) -> None:
        """Announce committed steps on core NATS; progress only, so a failed publish is logged
        and changes nothing."""
        for step in steps:
            try:
                await self._rt.nc.publish(
                    subjects.planner_progress(run.tenant),
                    self._encoder.encode(step_recorded(run.tenant, run.run_id, step)))
            except Exception as exc:
                log.debug("run %s: step %d not announced: %r", run.run_id, step.seq, exc)

    def _agent_refusal(self, run: RunRow) -> tuple[str, str] | None:
        """Why the run's agent takes no run, as (code, message); None if it takes this one.

        Raises:
            AgentUnavailable: the agent is initializing or stopping here (retry elsewhere).
        """
        agent = self._agents.get(run.agent)
        if agent is None or run.manifest is None:
            return "UNKNOWN_AGENT", f"no manifest declares agent {run.agent}"
        reason = agent.accepts_work()
        return None if reason is None else ("AGENT_UNAVAILABLE", reason)

    async def _next(self, conn: Any, run: RunRow, steps: list[Step],
                    finished: _Finished) -> _Effects | None:
        """Take (or reuse) the next decision and act on it; `_AGAIN` if the runtime answered it
        itself (a catalog sent, a selection refused, a critic's replan) or committed it before
        acting on it (an answer before its critic, a selection before its capability call)."""
        last = steps[-1] if steps else None
        fresh = False
        if last is not None and last.kind == "decision" and (
                last.payload.get("decision") != "request_capabilities"):
            decision = _DECISION_DECODER.decode(msgspec.json.encode(last.payload))
        else:
            decisions = sum(1 for s in steps if s.kind == "decision")
            if decisions >= self._max_decisions:
                return [await self._finish(conn, run, steps, "failed", finished,
                                           error=(BUDGET_CODE, f"{decisions} model decisions"))]
            try:
                decision = await self._decide(conn, run, steps, turn=decisions)
            except _Undescribed as exc:  # a capability without a description: no model call
                return [await self._finish(conn, run, steps, "failed", finished,
                                           error=("CAPABILITY_UNDESCRIBED", str(exc)))]
            except NoBudget as exc:
                return [await self._out_of_budget(conn, run, steps, finished, exc)]
            last, fresh = steps[-1], True
        if isinstance(decision, AnswerDirectly):
            if not has_critic(run.manifest):
                return [await self._finish(conn, run, steps, "succeeded", finished,
                                           answer=decision.answer, step=last.seq)]
            if fresh:
                return _AGAIN  # the answer is committed before the critic is asked about it
            return await self._criticise(conn, run, steps, last.seq, decision, finished)
        if isinstance(decision, RequestCapabilities):
            return _AGAIN  # the next model input carries the catalog
        if isinstance(decision, RequestHumanReview):
            return [await self._await_review(conn, run, steps, last.seq, decision, finished)]
        refused = selection_outcome(run.manifest, agent=run.agent, target=decision.capability,
                                    arguments=decision.arguments)
        if refused is None:
            if fresh:
                return _AGAIN  # the decision is committed before its capability call starts
            tool = read_target(run.manifest, decision.capability)
            if tool is not None:
                return await self._read(conn, run, steps, last.seq, tool, decision, finished)
            callee = agent_call_target(run.manifest, decision.capability)
            if callee is not None:
                return await self._call(conn, run, steps, last.seq, callee, decision, finished)
            return await self._propose(conn, run, steps, last.seq, decision, finished)
        output = SelectionRefused(run_id=run.run_id, step=last.seq,
                                  target=decision.capability[:128], check=refused[0],
                                  reason=refused[1])
        observation = observation_of(output)
        if await self._store.add_observation(conn, run, last.seq + 1, step=last.seq,
                                             output=msgspec.to_builtins(output),
                                             observation=observation):
            steps.append(Step(seq=last.seq + 1, kind="observation", payload=observation))
            self._selections_refused.labels(refused[0]).inc()
        log.info("run %s step %d: %s refused before any handler (%s)", run.run_id, last.seq,
                 decision.capability[:128], refused[0])
        return _AGAIN

    async def _propose(self, conn: Any, run: RunRow, steps: list[Step], seq: int,
                       decision: SelectCapability, finished: _Finished) -> _Effects:
        """Reserve the capability call (once per step), journal the proposal with that
        reservation, and send it to admission (again on a redelivery: same message id, same
        operation id)."""
        command = _proposal(run, seq, decision)
        try:
            _, new = await self._budget.reserve(conn, run, step_key(run.run_id, seq,
                                                                    "capability"),
                                                capability_calls=1)
        except NoBudget as exc:
            return [await self._out_of_budget(conn, run, steps, finished, exc)]
        if new:
            await self._store.add_proposal(conn, run, ProposalEntry(
                step=seq, action=command.action, arguments=command.arguments))
        return [(subjects.proposal(run.tenant), command, f"proposal:{run.run_id}:{seq}")]

    async def _read(self, conn: Any, run: RunRow, steps: list[Step], seq: int, tool: str,
                    decision: SelectCapability, finished: _Finished) -> _Effects | None:
        """Reserve the capability call (once per step), have retrieval read, and record its
        answer as the next observation, journaled with it, settling the call.

        Raises:
            ReadUnavailable: retrieval gave no final answer; the transaction rolls back (the
                decision stays committed) and the redelivery reads again under the same
                reservation, which governance keeps for the step's key.
        """
        key = step_key(run.run_id, seq, "capability")
        try:
            await self._budget.reserve(conn, run, key, capability_calls=1)
        except NoBudget as exc:
            return [await self._out_of_budget(conn, run, steps, finished, exc)]
        ask = ReadCapability(tenant=run.tenant, run_id=run.run_id, principal=run.principal,
                             agent=run.agent, tool=tool, arguments=decision.arguments)
        with self._rt.tracer.start_as_current_span("planner read",
                                                   kind=SpanKind.CLIENT) as span:
            span.set_attribute("writ.read.tool", tool)
            answer = await self._reads.read(ask)
            outcome = answer.code.lower() if isinstance(answer, ReadRefused) else "read"
            span.set_attribute("writ.read.outcome", outcome)
        output = ReadObserved(run_id=run.run_id, step=seq, tool=tool,
                              arguments=decision.arguments, answer=answer)
        observation = observation_of(output)
        if await self._store.add_observation(conn, run, seq + 1, step=seq,
                                             output=msgspec.to_builtins(output),
                                             observation=observation):
            steps.append(Step(seq=seq + 1, kind="observation", payload=observation))
            self._reads_observed.labels(outcome).inc()
        await self._budget.spent(conn, run, key, capability_calls=1)
        log.info("run %s step %d: %s observed (%s)", run.run_id, seq, tool, outcome)
        return _AGAIN

    async def _call(self, conn: Any, run: RunRow, steps: list[Step], seq: int, callee: str,
                    decision: SelectCapability, finished: _Finished) -> _Effects | None:
        """Call another agent as a branch of the run: reserve the capability call, have
        governance decide it, start the branch in this transaction (the call is then spent:
        the branch's own steps reserve what they use), and wake it; once the branch has ended,
        observe how. A redelivery finds the branch it started and neither decides nor reserves
        again.

        Raises:
            DecideUnavailable: governance gave no answer; the transaction rolls back (the
                decision stays committed) and the redelivery asks again.
        """
        branch = await self._store.run(conn, branch_run_id(run.run_id, seq))
        if branch is None:
            key = step_key(run.run_id, seq, "capability")
            try:
                await self._budget.reserve(conn, run, key, capability_calls=1)
            except NoBudget as exc:
                return [await self._out_of_budget(conn, run, steps, finished, exc)]
            request = str(decision.arguments.get("request", ""))
            verdict = await self._calls.decide(run, callee, request)
            agent = self._agents.get(callee)
            if verdict.verdict != "allow" or agent is None:
                outcome = "unknown_agent" if verdict.verdict == "allow" else (
                    "denied" if verdict.verdict == "deny" else "ask")
                reason = (f"no manifest declares agent {callee}" if agent is None
                          else verdict.reason)
                await self._budget.spent(conn, run, key, capability_calls=1)
                return await self._observe_call(conn, run, steps, AgentObserved(
                    run_id=run.run_id, step=seq, agent=callee, arguments=decision.arguments,
                    outcome=outcome, reason=reason[:512], pending_id=verdict.pending_id))
            branch = branch_run(run, seq, agent, decision.arguments)
            await self._store.create_branch(conn, branch)
            await self._budget.spent(conn, run, key, capability_calls=1)
            log.info("run %s step %d: branch %s of agent %s started", run.run_id, seq,
                     branch.run_id, callee)
        if branch.status in TERMINAL_RUN or branch.status == "awaiting_human":
            answered = branch.status == "succeeded"
            return await self._observe_call(conn, run, steps, AgentObserved(
                run_id=run.run_id, step=seq, agent=callee, arguments=decision.arguments,
                outcome="answered" if answered else (
                    "awaiting_human" if branch.status == "awaiting_human" else "failed"),
                branch=branch.run_id, answer=branch.answer if answered else None,
                reason="" if answered else
                f"{branch.error_code}: {branch.error_message or ''}"[:512]))
        return [(subjects.branch(run.tenant), BranchChanged(tenant=run.tenant,
                                                             run_id=branch.run_id),
                 f"branch:{branch.run_id}:start")]

    async def _observe_call(self, conn: Any, run: RunRow, steps: list[Step],
                            output: AgentObserved) -> _Effects | None:
        observation = observation_of(output)
        if await self._store.add_observation(conn, run, output.step + 1, step=output.step,
                                             output=msgspec.to_builtins(output),
                                             observation=observation):
            steps.append(Step(seq=output.step + 1, kind="observation", payload=observation))
            self._agent_calls.labels(output.outcome).inc()
        log.info("run %s step %d: the call of %s observed (%s)", run.run_id, output.step,
                 output.agent, output.outcome)
        return _AGAIN

    async def _criticise(self, conn: Any, run: RunRow, steps: list[Step], seq: int,
                         decision: AnswerDirectly, finished: _Finished) -> _Effects | None:
        """Ask the critic about the answer of step `seq`: accept ends the run with it, replan
        becomes the next decision's observation. The critic runs nothing."""
        rounds = sum(1 for s in steps if s.kind == "critic")
        key = step_key(run.run_id, seq + 1, "critic")
        value = critic_input(user=run.input, evidence=run.evidence,
                             observations=[s.payload for s in steps if s.kind == "observation"],
                             answer=decision.answer, round=rounds, agent=run.agent,
                             manifest=run.manifest)
        try:
            await self._budget.reserve(conn, run, key, provider_calls=1,
                                       tokens=self._reserve_tokens)
        except NoBudget as exc:
            return [await self._out_of_budget(conn, run, steps, finished, exc)]
        digest = input_digest(value)
        with self._rt.tracer.start_as_current_span("planner critic") as span:
            span.set_attribute("writ.critic_input.sha256", digest)
            verdict, tokens = await self._provider_call(conn, run, key,
                                                        self._provider.verify(value))
        await self._budget.spent(conn, run, key, provider_calls=1, tokens=tokens)
        payload = msgspec.to_builtins(verdict)
        await self._store.add_critic(conn, run, seq + 1, step=seq, round=rounds,
                                     verdict=payload, input_digest=digest)
        steps.append(Step(seq=seq + 1, kind="critic", payload=payload))
        if isinstance(verdict, Accept):
            return [await self._finish(conn, run, steps, "succeeded", finished,
                                       answer=decision.answer, step=seq)]
        output = CriticReplan(run_id=run.run_id, step=seq + 1, reason=verdict.reason)
        observation = observation_of(output)
        await self._store.add_observation(conn, run, seq + 2, step=seq + 1,
                                          output=msgspec.to_builtins(output),
                                          observation=observation)
        steps.append(Step(seq=seq + 2, kind="observation", payload=observation))
        log.info("run %s: the critic asked for a replan of step %d", run.run_id, seq)
        return _AGAIN

    async def _out_of_budget(self, conn: Any, run: RunRow, steps: list[Step],
                             finished: _Finished,
                             exc: NoBudget) -> tuple[str, msgspec.Struct, str]:
        """No step starts: the run fails naming the budget that ran out (the model is not asked
        whether to go on).

        Raises:
            RetryableError: only the concurrent-steps budget ran out, which frees itself once a
                step in flight settles.
        """
        if isinstance(exc, BudgetExhausted):
            if exc.kind == "concurrent_steps":
                raise RetryableError(f"run {run.run_id}: {exc}") from exc
            log.info("run %s: %s budget exhausted, no new step", run.run_id, exc.kind)
            return await self._finish(conn, run, steps, "failed", finished,
                                      error=(BUDGET_CODE, f"{exc.kind}: {exc}"))
        return await self._finish(conn, run, steps, "failed", finished,
                                  error=("NO_BUDGET", f"governance has no budget for the run: "
                                                      f"{exc}"))

    async def _provider_call(self, conn: Any, run: RunRow, key: str, call: Any) -> Any:
        """Await a provider call; one that fails for good settles what it used (the step is
        abandoned), one that may succeed later keeps its reservation for the retry."""
        try:
            return await call
        except PermanentError as exc:
            used = getattr(getattr(exc, "call", None), "total_tokens", 0) or 0
            await self._budget.spent(conn, run, key, provider_calls=1, tokens=used)
            raise

    async def _await_review(self, conn: Any, run: RunRow, steps: list[Step], seq: int,
                            decision: RequestHumanReview,
                            finished: _Finished) -> tuple[str, msgspec.Struct, str]:
        """The model asked for a person: the run waits, attended or not, for an explicit answer
        on `writ.int.planner.review`; the host is told what to review."""
        if await self._store.set_status(conn, run, "awaiting_human", step=seq,
                                        error_code=REVIEW_CODE,
                                        error_message=decision.review_prompt):
            finished.append(("awaiting_human", REVIEW_CODE))
        run = msgspec.structs.replace(run, status="awaiting_human", error_code=REVIEW_CODE,
                                      error_message=decision.review_prompt)
        return self._result(run, steps, pending_id=_review_id(run.run_id, seq))

    async def answer_review(self, answer: ReviewAnswer) -> RunResult:
        """A person's explicit answer to the review a run waits for: approve resumes the run
        (the answer is the model's next observation), reject fails it with `REJECTED`.

        Raises:
            _ReviewRefused: the tenant has no such run waiting for this review.
        """
        finished: _Finished = []
        async with self._store.acquire() as conn, conn.transaction():
            run = await self._store.lock_run(conn, answer.run_id)
            if run is None or run.tenant != answer.tenant:
                raise _ReviewRefused("no such run")
            steps = await self._store.steps(conn, run.run_id)
            seen = len(steps)
            last = steps[-1] if steps else None
            if (run.status != "awaiting_human" or run.error_code != REVIEW_CODE
                    or last is None or last.seq != answer.step
                    or last.payload.get("decision") != "request_human_review"):
                raise _ReviewRefused("the run is not waiting for this review")
            output = ReviewAnswered(run_id=run.run_id, step=answer.step, answer=answer.answer,
                                    reviewer=answer.reviewer, reason=answer.reason)
            observation = observation_of(output)
            await self._store.add_observation(conn, run, answer.step + 1, step=answer.step,
                                              output=msgspec.to_builtins(output),
                                              observation=observation)
            steps.append(Step(seq=answer.step + 1, kind="observation", payload=observation))
            if answer.answer == "reject":
                effects: _Effects | None = [await self._finish(
                    conn, run, steps, "failed", finished, step=answer.step,
                    error=("REJECTED", answer.reason or "the reviewer rejected it"))]
            else:
                await self._store.set_status(conn, run, "running", step=answer.step)
                run = msgspec.structs.replace(run, status="running", error_code=None,
                                              error_message=None)
                effects = await self._next(conn, run, steps, finished)
        await self._announce(run, steps[seen:])
        effects = await self._continue(run.run_id, effects, finished)
        await self._committed(finished, effects)
        result = next((m for _, m, _ in effects if isinstance(m, RunResult)), None)
        return result or RunResult(request_id=run.request_id, run_id=run.run_id,
                                   status="awaiting_human", answer=None)

    async def _review_endpoint(self, request: Request) -> None:
        """`writ.int.planner.review`: 400 undecodable, 404 no such review waiting."""
        try:
            answer = self._review_decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ReviewAnswer: {exc}")
            return
        try:
            result = await self.answer_review(answer)
        except _ReviewRefused as exc:
            await request.respond_error("404", str(exc))
            return
        except Exception as exc:
            log.warning("review answer failed: %r", exc)
            await request.respond_error("500", "review answer failed")
            return
        await request.respond(self._encoder.encode(result))

    async def _decide(self, conn: Any, run: RunRow, steps: list[Step], *,
                      turn: int) -> ModelDecision:
        """Reserve the call, ask the model, settle, and record its response, journaled.

        Raises:
            _Undescribed: a capability has no description (nothing reserved, no call).
            NoBudget: a budget ran out (or the run has none): no call.
        """
        try:
            value = model_input(user=run.input, evidence=run.evidence,
                                observations=[s.payload for s in steps
                                              if s.kind == "observation"],
                                turn=turn, agent=run.agent, manifest=run.manifest,
                                catalog_requested=any(
                                    s.kind == "decision"
                                    and s.payload.get("decision") == "request_capabilities"
                                    for s in steps))
        except ValueError as exc:
            raise _Undescribed(str(exc)) from exc
        digest = input_digest(value)
        seq = steps[-1].seq + 1 if steps else 0
        key = step_key(run.run_id, seq, "model")
        await self._budget.reserve(conn, run, key, provider_calls=1, tokens=self._reserve_tokens)
        with self._rt.tracer.start_as_current_span("planner model") as span:
            span.set_attribute("writ.model_input.sha256", digest)
            decision, tokens = await self._provider_call(
                conn, run, key, self._provider.decide_with_usage(value))
        await self._budget.spent(conn, run, key, provider_calls=1, tokens=tokens)
        payload = msgspec.to_builtins(decision)
        # A selection's proposal is journaled once its capability call is reserved (`_propose`).
        await self._store.add_decision(conn, run, seq, payload, turn=turn, input_digest=digest,
                                       proposal=None)
        steps.append(Step(seq=seq, kind="decision", payload=payload))
        return decision

    async def _refused(self, conn: Any, run: RunRow, steps: list[Step],
                       event: ProposalRefused,
                       finished: _Finished) -> list[tuple[str, msgspec.Struct, str]]:
        if event.verdict == "ask":
            # The run stops for a person: its capability call is over for the budget (the
            # reservation is not held across the wait; governance's clock pauses meanwhile).
            await self._budget.spent(conn, run, step_key(run.run_id, event.step, "capability"),
                                     capability_calls=1)
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
        if (branch := branch_of(run.manifest)) is not None:
            # A branch answers the run that called it, not the host: that run is woken to
            # observe how the branch ended (read from the store, so a duplicate changes nothing).
            return (subjects.branch(run.tenant),
                    BranchChanged(tenant=run.tenant, run_id=branch["parent_run_id"]),
                    f"branch:{run.run_id}:{run.status}:{len(steps)}")
        result = RunResult(request_id=run.request_id, run_id=run.run_id, status=status,
                           error=error, answer=run.answer, actions=actions,
                           pending_id=pending_id, proposal=proposal)
        return (subjects.result(run.tenant), result,
                f"result:{run.run_id}:{run.status}:{len(steps)}")


def _review_id(run_id: str, step: int) -> str:
    return f"review-{run_id}-{step}"[:128]


def _proposal(run: RunRow, step: int, decision: SelectCapability) -> ProposeCommand:
    return ProposeCommand(run_id=run.run_id, step=step, tenant=run.tenant,
                          principal=run.principal, agent=run.agent,
                          action=action_name(decision.capability)[:512],
                          arguments=decision.arguments)


def _action_result(payload: dict[str, Any]) -> ActionResult:
    return ActionResult(action=payload["action"], operation_id=payload["operation_id"],
                        state=payload["state"], receipt=payload.get("receipt"),
                        reason=payload.get("reason"), outcome=payload.get("outcome"),
                        correlation_id=payload.get("correlation_id"))
