"""Planner: the model loop. It proposes; it never acts and never holds a credential.

Each delivery advances one run under a row lock: record what arrived (evidence, an outcome, a
refusal, a branch's change, a person's answer to the read the run waits for), take the next model
decision — reusing the recorded one if this step was already
decided — and publish what follows after the commit (`effects.py`). A redelivery re-publishes
the same messages with the same `Nats-Msg-Id`, so nothing happens twice. Each decision and
observation is committed as a step before the next decision is asked for.

The decision protocol (`protocol.py`): a run starts only for an agent a manifest
declares and that takes work (`agents.py`), with a snapshot of it (`snapshot.py`); its model
first sees a summary of the agent's capabilities and the catalog once it asked
(`request_capabilities`; the model's input: `inputs.py`). What each decision leads to lives in
its own module:

- `select_capability`: checked, then refused, proposed to admission, read by retrieval or called
  as another agent's branch run (`capabilities.py`, `reads.py`, `branches.py`); what the model
  reads of each output is `observations.py`;
- `request_human_review`: the run waits for a person's answer (`review.py`); so does a run whose
  read, proposal or branch waits for a person's decision (`_wait_for_person`, the decision's id in
  `planner.runs.pending_id`), until that decision's answer or outcome arrives;
- `answer_directly`: the run ends with the answer, or first asks the agent's critic
  (`critic.py`).

Budgets (docs/design.md invariant 9, `budgeting.py`): every provider call (a decision, a critic's
verdict) first reserves a provider call and tokens of the run's budget in governance, and every
capability call a capability call; each is settled with what it used. A budget that ran out
stops the run in code — `failed` with `BUDGET_EXHAUSTED` naming the budget (`codes.py`) — and the
model is not asked whether to continue.

Each captured model response, tool output (a read's answer included) and status change is
journaled with the step or status it records (`store.py`, `journal_entries.py`); the planner also
seals its journal and serves `writ.int.planner.replay`, the offline replay of a run (`replay/`),
and `writ.int.planner.review` (`endpoints.py`). Each committed step is announced on core NATS
`writ.events.planner.<tenant>` (`progress.py`), for those who watch; its counters are
`metrics.py`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio
import anyio.abc
import msgspec

from libs.actor import Delivery, run_actor
from libs.budget import BudgetExhausted, NoBudget
from libs.bus import ConsumerSpec, publish
from libs.errors import PermanentError, RetryableError
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from schemas import subjects
from schemas.admission import CommandAdmitted, ProposalRefused
from schemas.control import CANCEL_CODE, RunCancelRequested
from schemas.dispatcher import CommandOutcome
from schemas.governance import DecisionAnswered, LeaseAmounts
from schemas.host import ProposalView, RunResult
from schemas.planner import (
    REVIEW,
    BranchChanged,
    ProposeCommand,
    ReplayReport,
    ReplayRun,
    ReviewAnswer,
    ReviewTaken,
)
from schemas.reads import REVIEWS_LIST, RUN_EVENTS, RUN_STATUS
from schemas.retrieval import EvidenceGathered
from schemas.sessions import SESSION_OPS
from services.planner.agents import AgentRegistry
from services.planner.branches import CallDecider
from services.planner.budgeting import RunBudgets, step_key
from services.planner.cancel import cancelled_by, in_flight, record_cancel
from services.planner.capabilities import Capabilities, Waiting, waiting_on
from services.planner.codes import BUDGET_CODE
from services.planner.critic import Critic
from services.planner.effects import AGAIN, Effect, Effects, Finished
from services.planner.endpoints import ReplayEndpoint, ReviewEndpoint
from services.planner.inputs import input_digest, model_input, with_injected
from services.planner.mcp_catalog import with_mcp_descriptions
from services.planner.metrics import PlannerMetrics
from services.planner.observations import observation_of
from services.planner.progress import announce
from services.planner.provider import (
    AnswerDirectly,
    DecisionProvider,
    ModelDecision,
    RequestCapabilities,
    RequestHumanReview,
    SelectCapability,
)
from services.planner.reads import ReadClient
from services.planner.results import result_effect
from services.planner.review import await_review, record_answer, review_id
from services.planner.sessions import ModelCallAbandoned, SessionOpsEndpoint, SessionTurns
from services.planner.sessions._plans import (
    PAUSE_PREFIX,
    PLAN_WAIT,
    model_payload,
    plan_taken,
)
from services.planner.sessions.logic import is_turn_run
from services.planner.snapshot import (
    branch_of,
    has_critic,
    selection_outcome,
    snapshot_of,
)
from services.planner.status import ReviewsEndpoint, RunEventsEndpoint, RunStatusEndpoint
from services.planner.store import TERMINAL_RUN, PlannerStore, RunRow, Step
from services.planner.waits import PersonWaits

__all__ = ["CONCURRENCY", "PlannerService", "pool_size"]

# Deliveries one planner handles at once: at least the runs a host keeps in flight (the bench
# keeps 32), since a run's delivery waits on governance's budget replies, not on CPU.
CONCURRENCY = 32
# Connections beyond one per delivery in flight: the sealer, the review and replay endpoints.
POOL_HEADROOM = 4 + 8  # and the chat sessions' endpoint and model-call counts
INBOX = ConsumerSpec(stream="WRIT_INT", durable="planner", filter_subjects=subjects.PLANNER_IN)
Inbound = (
    EvidenceGathered
    | CommandOutcome
    | CommandAdmitted
    | ProposalRefused
    | BranchChanged
    | DecisionAnswered
    | RunCancelRequested
)
log = logging.getLogger("writ.planner")
_DECISION_DECODER = msgspec.json.Decoder(ModelDecision)


def pool_size(concurrency: int = CONCURRENCY) -> int:
    """The connections a planner handling `concurrency` deliveries at once needs: one each,
    held for the whole delivery, and the headroom its sealer and endpoints use."""
    return concurrency + POOL_HEADROOM


class _Undescribed(Exception):
    """A capability of the run's catalog has no description: no model call is made."""


class PlannerService:
    """Drives runs from evidence to a final answer, one recorded step at a time."""

    def __init__(
        self,
        *,
        rt: Runtime,
        store: PlannerStore,
        provider: DecisionProvider,
        agents: AgentRegistry,
        max_decisions: int = 8,
        reserve_tokens: int = 4096,
        sealer: Sealer | None = None,
        reads: ReadClient | None = None,
        calls: CallDecider | None = None,
        concurrency: int = CONCURRENCY,
        sessions: SessionTurns | None = None,
        lease_steps: int = 8,
    ) -> None:
        self._rt, self._store, self._provider = rt, store, provider
        # Chat sessions (docs/design.md §10): each turn is a run of this loop; None only in tests
        # of something else.
        self._sessions = sessions
        # Deliveries handled at once. Each holds one pooled connection for as long as it runs
        # (its run's row lock is held across governance's budget replies), so the pool must
        # have `pool_size(concurrency)` connections: with fewer, handlers queue for one.
        self._concurrency = concurrency
        self._agents = agents
        # What a provider call reserves of the run's tokens before it starts (settled with
        # what the provider reports it used).
        self._reserve_tokens = reserve_tokens
        # A root run leases its budgets for up to `lease_steps` steps at once (0: no lease).
        self._budget = RunBudgets(
            nc=rt.nc,
            store=store,
            lease=LeaseAmounts(
                provider_calls=lease_steps,
                tokens=lease_steps * reserve_tokens,
                capability_calls=lease_steps,
            )
            if lease_steps > 0
            else None,
            model=getattr(provider, "priced_as", None),
        )
        self._max_decisions, self._sealer = max_decisions, sealer
        self._decoder = msgspec.json.Decoder(Inbound)
        self._metrics = PlannerMetrics(rt.registry)
        self._capabilities = Capabilities(
            store=store,
            budget=self._budget,
            reads=reads if reads is not None else ReadClient(nc=rt.nc),
            calls=calls if calls is not None else CallDecider(nc=rt.nc),
            agents=agents,
            tracer=rt.tracer,
            metrics=self._metrics,
        )
        self._critic = Critic(
            store=store,
            budget=self._budget,
            provider=provider,
            tracer=rt.tracer,
            reserve_tokens=reserve_tokens,
        )
        self._replay = ReplayEndpoint(rt=rt, store=store)
        self._waits = PersonWaits(
            store=store,
            capabilities=self._capabilities,
            budget=self._budget,
            sessions=self._sessions,
            next_step=self._next,
            finish=self._finish,
            result=self._result,
        )

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume evidence and outcomes, seal the journal and serve replays until stopped."""
        if self._store.journal is not None:
            self._rt.endpoints.append(
                Endpoint("replay", subjects.REPLAY, self._replay, concurrency=8)
            )
        self._rt.endpoints.append(
            Endpoint("run", RUN_STATUS, RunStatusEndpoint(store=self._store), concurrency=32)
        )
        self._rt.endpoints.append(
            Endpoint("events", RUN_EVENTS, RunEventsEndpoint(store=self._store), concurrency=32)
        )
        self._rt.endpoints.append(
            Endpoint("reviews", REVIEWS_LIST, ReviewsEndpoint(store=self._store), concurrency=8)
        )
        self._rt.endpoints.append(
            Endpoint("review", REVIEW, ReviewEndpoint(answer=self.answer_review), concurrency=8)
        )
        if self._sessions is not None:
            self._rt.endpoints.append(
                Endpoint(
                    "sessions",
                    SESSION_OPS,
                    SessionOpsEndpoint(turns=self._sessions, agents=self._agents),
                    concurrency=6,
                )
            )
        try:
            async with anyio.create_task_group() as tg:
                if self._sealer is not None:
                    await tg.start(self._sealer.run)  # chains and signs the audit journal
                if self._sessions is not None:
                    tg.start_soon(self._sessions.sweep)  # what a crash left after a commit
                    tg.start_soon(self._sessions.follow_admitted)  # sessions' StepAdmitted
                    tg.start_soon(self._sessions.in_flight.follow)  # a close's cancelling
                await run_actor(
                    js=self._rt.js,
                    spec=INBOX,
                    decoder=self._decoder,
                    handler=self.handle,
                    metrics=self._rt.metrics,
                    tracer=self._rt.tracer,
                    stopping=self._rt.stopping,
                    concurrency=self._concurrency,
                    health=self._rt.health,
                    task_status=task_status,
                    backoff_max_s=self._rt.retry_backoff_max_s,
                )
                tg.cancel_scope.cancel()
        finally:
            self._agents.stop_all()

    async def replay(self, ask: ReplayRun) -> ReplayReport | None:
        """Replay one run offline from the journal; None if the tenant has no such run."""
        return await self._replay.replay(ask)

    async def handle(self, delivery: Delivery[Inbound]) -> None:
        """Record what arrived and advance its run."""
        event = delivery.message
        if self._sessions is not None and isinstance(event, CommandAdmitted):
            await self._sessions.progress(
                tenant=event.tenant,
                run_id=event.run_id,
                step=event.step,
                operation_id=event.operation_id,
            )
        elif self._sessions is not None and isinstance(event, DecisionAnswered):
            await self._sessions.progress(
                tenant=event.tenant,
                run_id=event.run_id,
                pending_id=event.pending_id,
                answer=event.answer,
            )
        if isinstance(event, CommandAdmitted):
            return  # progress, not a step: the outcome is what the model observes
        if isinstance(event, DecisionAnswered) and event.proposal_id is not None:
            return  # an answer about a proposal: admission acts on it, the outcome follows
        finished: Finished = []
        # One connection for the whole delivery: its transactions follow one another, and a
        # handler never waits for the pool twice (an outcome for a run this planner never
        # started finds no row to lock, and drives nothing).
        async with self._store.acquire() as conn:
            with self._rt.tracer.start_as_current_span("planner step") as span:
                span.set_attribute("writ.run_id", event.run_id)
                if isinstance(event, EvidenceGathered):
                    manifest = await with_mcp_descriptions(  # mcp_catalog.py
                        self._rt.nc,
                        event.tenant,
                        snapshot_of(
                            self._agents.get(event.agent), chat_turn=is_turn_run(event.run_id)
                        ),
                    )
                    await self._store.create_run(event, manifest=manifest, conn=conn)
                elif isinstance(event, RunCancelRequested):
                    await record_cancel(conn, event)  # kept even before the run exists
                # A step's settlement travels with the next reservation; what is left (a
                # finished run's lease) is settled once the effects are out, not before: all
                # of it is committed, and until the delivery is acked a redelivery's
                # `settle_due` settles whatever this one did not (`budgeting.py`).
                async with self._budget.deferring(conn):
                    effects = await self._advance(conn, event, finished)
                    await self._committed(finished, effects)

    async def _committed(self, finished: Finished, effects: Effects) -> None:
        # Committed: count each run's end once. A redelivery re-publishes a terminal run's
        # result through the replay path, which finishes nothing and is not counted again.
        for status, code in finished:
            self._metrics.finished.labels(status).inc()
            if code == BUDGET_CODE:
                self._metrics.budget_exhausted.inc()
        if any(isinstance(m, ProposeCommand) for _, m, _ in effects):
            # Armed by the fault suite: the decision and its reservation are committed, the
            # proposal is not published yet (the redelivery publishes it, the model unasked).
            self._rt.faults.crash_if("planner.before_proposal")
        for subject, message, msg_id in effects:
            await publish(self._rt.js, subject, message, msg_id=msg_id)

    async def _advance(self, conn: Any, event: Inbound, finished: Finished) -> Effects:
        async with conn.transaction():
            locked = await self._store.locked(conn, event.run_id)
            if locked is None:
                return []  # an outcome for a run this planner never started: nothing to drive
            run, state = locked
            self._budget.known(run, state.reservations, state.now)
            steps = state.steps
            seen = len(steps)
            effects = await self._advance_run(
                conn, run, steps, event, finished, cancelled=state.cancelled_by
            )
            if effects is not AGAIN:  # the delivery's last transaction
                await self._budget.settle_deferred(conn)
            if self._sessions is not None:
                await self._sessions.record_steps(conn, run, steps[seen:])
            await self._budget.flush(conn)
        await announce(self._rt.nc, run, steps[seen:])
        try:
            return await self._continue(conn, run.run_id, effects, finished)
        finally:
            if self._sessions is not None:
                await self._sessions.flush_run(run.run_id)

    async def _advance_run(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        event: Inbound,
        finished: Finished,
        *,
        cancelled: str | None,
    ) -> Effects | None:
        await self._budget.settle_due(conn, run)
        # An ask is not an observation: the step's observation is what the answer leads to.
        if isinstance(event, CommandOutcome) or (
            isinstance(event, ProposalRefused) and event.verdict != "ask"
        ):
            observation = observation_of(event)
            if await self._store.add_observation(
                conn,
                run,
                event.step + 1,
                step=event.step,
                output=msgspec.to_builtins(event),
                observation=observation,
            ):
                steps.append(Step(seq=event.step + 1, kind="observation", payload=observation))
                if self._sessions is not None and isinstance(event, CommandOutcome):
                    await self._sessions.observed(conn, run, event.step, observation)
                elif self._sessions is not None:
                    await self._sessions.refused(conn, run, event.step, observation)
            # The capability call has its outcome (or its refusal): it is over.
            await self._budget.spent(
                conn, run, step_key(run.run_id, event.step, "capability"), capability_calls=1
            )
        if run.status not in TERMINAL_RUN and (by := cancelled):
            if (
                run.status == "running"
                and in_flight(steps)
                and not isinstance(event, ProposalRefused)
            ):
                return []  # an admitted command runs to its outcome, observed before the end
            return [
                await self._finish(
                    conn,
                    run,
                    steps,
                    "cancelled",
                    finished,
                    error=(CANCEL_CODE, f"cancelled by {by}"),
                )
            ]
        if isinstance(event, DecisionAnswered):
            return await self._waits.answered(conn, run, steps, event, finished)
        if run.status in TERMINAL_RUN:
            return [self._result(run, steps)]
        if isinstance(event, ProposalRefused):
            return await self._waits.refused(conn, run, steps, event, finished)
        if (
            run.status == "awaiting_human"
            and isinstance(event, BranchChanged)
            and self._sessions is not None
            and (run.pending_id or "").startswith("plan-")
        ):
            return await self._waits.plan_answered(conn, run, steps, finished)
        if (
            run.status == "awaiting_human"
            and isinstance(event, BranchChanged)
            and self._sessions is not None
            and (run.pending_id or "").startswith(PAUSE_PREFIX)
        ):
            if await self._sessions.holds(conn, run):
                return []  # still paused
            await self._store.set_status(conn, run, "running", step=steps[-1].seq)
            run = msgspec.structs.replace(
                run, status="running", error_code=None, error_message=None, pending_id=None
            )
            return await self._next(conn, run, steps, finished)
        if run.status == "awaiting_human":
            if isinstance(event, BranchChanged):
                # A run waiting on a branch that waited for a person: it goes on once the
                # branch does (its call is then observed), or waits on for what the branch
                # waits for now.
                branch = await self._waits.waited_branch(conn, run, steps)
                if branch is None:
                    return []
                if branch.status == "awaiting_human":
                    waiting = waiting_on(branch)
                    return await self._waits.wait_for_person(
                        conn,
                        run,
                        steps,
                        finished,
                        step=steps[-1].seq,
                        pending_id=waiting.pending_id,
                        message=waiting.message,
                    )
            elif not isinstance(event, CommandOutcome):
                return []  # still waiting for the person
            # The person said yes (and the command ran, or the branch went on): the run goes on
            # from here.
            await self._store.set_status(
                conn,
                run,
                "running",
                step=event.step if isinstance(event, CommandOutcome) else steps[-1].seq,
            )
            run = msgspec.structs.replace(
                run, status="running", error_code=None, error_message=None, pending_id=None
            )
        if not steps and (refusal := self._agent_refusal(run)) is not None:
            return [await self._finish(conn, run, steps, "failed", finished, error=refusal)]
        return await self._next(conn, run, steps, finished)

    async def _continue(
        self, conn: Any, run_id: str, effects: Effects | None, finished: Finished
    ) -> Effects:
        """Take the decisions the runtime answers itself, each in its own transaction, so each
        step is committed before the next decision is asked for."""
        while effects is AGAIN:
            # Armed by the fault suite: a step (a model decision) is committed and nothing
            # that follows it has started.
            self._rt.faults.crash_if("planner.after_decision")
            async with conn.transaction():
                locked = await self._store.locked(conn, run_id)
                if locked is None or locked[0].status != "running":
                    return []
                run, state = locked
                self._budget.known(run, state.reservations, state.now)
                steps = state.steps
                seen = len(steps)
                if by := state.cancelled_by:  # nothing more is scheduled
                    effects = [
                        await self._finish(
                            conn,
                            run,
                            steps,
                            "cancelled",
                            finished,
                            error=(CANCEL_CODE, f"cancelled by {by}"),
                        )
                    ]
                    await self._budget.flush(conn)
                    break
                effects = await self._next(conn, run, steps, finished)
                if effects is not AGAIN:  # the delivery's last transaction
                    await self._budget.settle_deferred(conn)
                if self._sessions is not None:
                    await self._sessions.record_steps(conn, run, steps[seen:])
                await self._budget.flush(conn)  # before it commits: what was written behind
            await announce(self._rt.nc, run, steps[seen:])
        return effects

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

    async def _next(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished
    ) -> Effects | None:
        """Take (or reuse) the next decision and act on it; `AGAIN` if the runtime answered it
        itself (a catalog sent, a selection refused, a critic's replan) or committed it before
        acting on it (an answer before its critic, a read's or a branch's selection before the
        call; an action's proposal is recorded with its decision and sent after the commit)."""
        last = steps[-1] if steps else None
        fresh = False
        if (
            last is not None
            and last.kind == "decision"
            and (last.payload.get("decision") != "request_capabilities")
        ):
            decision = _DECISION_DECODER.decode(msgspec.json.encode(model_payload(last.payload)))
            if (
                isinstance(decision, SelectCapability)
                and self._sessions is not None
                and await self._sessions.holds(conn, run)
            ):
                await self._sessions.hold(conn, self._store, run, last.seq)
                return []  # nothing it selects is admitted until the session resumes
        else:
            if self._sessions is not None and not await self._sessions.gate(conn, run, steps):
                return []  # its session is paused: no decision until it resumes
            decisions = sum(
                1 for s in steps if s.kind == "decision" and plan_taken(s.payload) is None
            )
            if self._sessions is not None and (
                planned := await self._sessions.plans.next_step(conn, run, steps)
            ):
                if isinstance(planned, tuple):  # a step of the approved plan did not succeed
                    return [await self._finish(conn, run, steps, "failed", finished, error=planned)]
                await self._sessions.plans.take(
                    conn, self._store, run, steps, planned, turn=decisions
                )
                return AGAIN  # committed before it is acted on, as a model's selection
            if decisions >= self._max_decisions:
                return [
                    await self._finish(
                        conn,
                        run,
                        steps,
                        "failed",
                        finished,
                        error=(BUDGET_CODE, f"{decisions} model decisions"),
                    )
                ]
            try:
                decision = await self._decide(conn, run, steps, turn=decisions)
            except _Undescribed as exc:  # a capability without a description: no model call
                return [
                    await self._finish(
                        conn,
                        run,
                        steps,
                        "failed",
                        finished,
                        error=("CAPABILITY_UNDESCRIBED", str(exc)),
                    )
                ]
            except NoBudget as exc:
                return [await self._out_of_budget(conn, run, steps, finished, exc)]
            except ModelCallAbandoned:  # its session closed mid-call: nothing more is asked
                by = await cancelled_by(conn, run) or "the session's close"
                return [
                    await self._finish(
                        conn,
                        run,
                        steps,
                        "cancelled",
                        finished,
                        error=(CANCEL_CODE, f"cancelled by {by}"),
                    )
                ]
            except PermanentError as exc:
                return [await self._model_failed(conn, run, steps, finished, exc)]
            last, fresh = steps[-1], True
        if isinstance(decision, AnswerDirectly):
            if (
                fresh
                and self._sessions is not None
                and await self._sessions.plans.planning(conn, run, steps)
            ):
                # The answer is committed before its plan is frozen: the facts a plan's
                # preview reads may fail to be read, and are then read again, not the model.
                return AGAIN
            if self._sessions is not None and (
                plan_id := await self._sessions.plans.freeze(conn, run, steps, last.seq)
            ):
                return await self._waits.wait_for_person(  # the plan waits for the user's answer
                    conn, run, steps, finished, step=last.seq, pending_id=plan_id, message=PLAN_WAIT
                )
            if not has_critic(run.manifest):
                return [
                    await self._finish(
                        conn,
                        run,
                        steps,
                        "succeeded",
                        finished,
                        answer=decision.answer,
                        step=last.seq,
                    )
                ]
            if fresh:
                return AGAIN  # the answer is committed before the critic is asked about it
            try:
                accepted = await self._critic.accepts(conn, run, steps, last.seq, decision)
            except NoBudget as exc:
                return [await self._out_of_budget(conn, run, steps, finished, exc)]
            except PermanentError as exc:
                return [await self._model_failed(conn, run, steps, finished, exc)]
            if not accepted:
                return AGAIN  # the critic's reason is the next decision's observation
            return [
                await self._finish(
                    conn, run, steps, "succeeded", finished, answer=decision.answer, step=last.seq
                )
            ]
        if isinstance(decision, RequestCapabilities):
            return AGAIN  # the next model input carries the catalog
        if isinstance(decision, RequestHumanReview):
            run = await await_review(self._store, conn, run, last.seq, decision, finished)
            return [self._result(run, steps, pending_id=review_id(run.run_id, last.seq))]
        refused = selection_outcome(
            run.manifest, agent=run.agent, target=decision.capability, arguments=decision.arguments
        )
        plan_preview = None
        if refused is None and self._sessions is not None:  # a plan-mode turn's plan
            check = await self._sessions.plans.check(
                conn, run, steps, decision, read_facts=not fresh
            )
            refused, decision, plan_preview = check.refused, check.decision, check.plan_preview
        if refused is not None:
            await self._capabilities.refuse(conn, run, steps, last.seq, decision, refused)
            return AGAIN  # (an approved plan's step refused ends the plan: `plans.next_step`)
        if fresh and (is_turn_run(run.run_id) or not self._capabilities.proposes(run, decision)):
            # The decision is committed before its capability call starts: a read or a branch
            # that fails is made again without asking the model again, and so is a plan
            # step's facts read. A proposal is only published once the transaction that
            # records it (and the decision) commits, so it is proposed in the same one.
            return AGAIN
        try:
            acted = await self._capabilities.act(
                conn, run, steps, last.seq, decision, plan_preview=plan_preview
            )
        except NoBudget as exc:
            return [await self._out_of_budget(conn, run, steps, finished, exc)]
        if isinstance(acted, Waiting):
            return await self._waits.wait_for_person(
                conn,
                run,
                steps,
                finished,
                step=last.seq,
                pending_id=acted.pending_id,
                message=acted.message,
            )
        return acted

    async def _model_failed(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished, exc: PermanentError
    ) -> Effect:
        """The provider gave no decision (or verdict) and asking again will not give one: a
        malformed answer, a refusal, a rejected request. The run fails saying so; nothing is
        guessed at, and the run is never left running with nobody to drive it."""
        log.warning("run %s: the model call failed for good: %r", run.run_id, exc)
        return await self._finish(
            conn,
            run,
            steps,
            "failed",
            finished,
            error=("MODEL_FAILED", f"{type(exc).__name__}: {exc}"),
        )

    async def _out_of_budget(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished, exc: NoBudget
    ) -> Effect:
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
            return await self._finish(
                conn, run, steps, "failed", finished, error=(BUDGET_CODE, f"{exc.kind}: {exc}")
            )
        return await self._finish(
            conn,
            run,
            steps,
            "failed",
            finished,
            error=("NO_BUDGET", f"governance has no budget for the run: {exc}"),
        )

    async def answer_review(self, answer: ReviewAnswer) -> ReviewTaken:
        """A person's explicit answer to the review a run waits for (`review.py`): approve
        resumes the run (the answer is the model's next observation), reject fails it with
        `REJECTED`.

        Raises:
            ReviewRefused: the tenant has no such run waiting for this review.
        """
        finished: Finished = []
        async with self._store.acquire() as conn:
            async with conn.transaction():
                run, steps, seen = await record_answer(self._store, conn, answer)
                if answer.answer == "reject":
                    effects: Effects | None = [
                        await self._finish(
                            conn,
                            run,
                            steps,
                            "failed",
                            finished,
                            step=answer.step,
                            error=("REJECTED", answer.reason or "the reviewer rejected it"),
                        )
                    ]
                else:
                    await self._store.set_status(conn, run, "running", step=answer.step)
                    effects = AGAIN  # committed before the next decision is asked for
            await announce(self._rt.nc, run, steps[seen:])
            try:
                # A delivery's scope, as the inbox's: the steps draw on the run's lease (and
                # a step redone there after a failure here takes the same one).
                async with self._budget.deferring(conn):
                    effects = await self._continue(conn, run.run_id, effects, finished)
            except RetryableError as exc:
                # The answer is recorded; what follows it cannot be taken now (retrieval or
                # governance did not answer). The run's inbox takes it from here, retried like
                # any delivery, rather than leaving the run running with nobody driving it.
                log.info("run %s: going on after the review in its inbox: %s", run.run_id, exc)
                effects = [
                    (
                        subjects.branch(run.tenant),
                        BranchChanged(tenant=run.tenant, run_id=run.run_id),
                        f"wake:{run.run_id}:{answer.step}",
                    )
                ]
        await self._committed(finished, effects)
        result = next((m for _, m, _ in effects if isinstance(m, RunResult)), None)
        # No result: the run goes on (a proposal's outcome, a branch, or its inbox's retry).
        return ReviewTaken(run_id=run.run_id, status="running" if result is None else result.status)

    async def _decide(
        self, conn: Any, run: RunRow, steps: list[Step], *, turn: int
    ) -> ModelDecision:
        """Reserve the call, ask the model, settle, and record its response, journaled.

        Raises:
            _Undescribed: a capability has no description (nothing reserved, no call).
            NoBudget: a budget ran out (or the run has none): no call.
            ModelCallAbandoned: a chat turn's session closed during the call (settled as
                its reservation, nothing recorded).
        """
        try:
            injected = [
                text
                for s in steps
                if s.kind == "injected"
                for text in s.payload.get("injected", [])
            ]
            value = model_input(
                user=with_injected(run.input, injected),
                evidence=run.evidence,
                observations=[s.payload for s in steps if s.kind == "observation"],
                turn=turn,
                agent=run.agent,
                manifest=run.manifest,
                catalog_requested=any(
                    s.kind == "decision" and s.payload.get("decision") == "request_capabilities"
                    for s in steps
                ),
            )
        except ValueError as exc:
            raise _Undescribed(str(exc)) from exc
        digest = input_digest(value)
        seq = steps[-1].seq + 1 if steps else 0
        key = step_key(run.run_id, seq, "model")
        await self._budget.reserve(conn, run, key, provider_calls=1, tokens=self._reserve_tokens)
        with self._rt.tracer.start_as_current_span("planner model") as span:
            span.set_attribute("writ.model_input.sha256", digest)
            try:
                async with self._text_sink(run, seq) as sink:
                    decision, tokens = await self._budget.provider_call(
                        conn, run, key, self._provider.decide_with_usage(value, text=sink)
                    )
            except ModelCallAbandoned:
                # What the cut call used is unknown: it is settled as all it reserved.
                await self._budget.spent(
                    conn, run, key, provider_calls=1, tokens=self._reserve_tokens
                )
                raise
        await self._budget.spent(conn, run, key, provider_calls=1, tokens=tokens)
        payload = msgspec.to_builtins(decision)
        # A selection's proposal is journaled once its capability call is reserved
        # (`capabilities.py`).
        await self._store.add_decision(
            conn, run, seq, payload, turn=turn, input_digest=digest, proposal=None
        )
        steps.append(Step(seq=seq, kind="decision", payload=payload))
        return decision

    def _text_sink(self, run: RunRow, seq: int) -> Any:
        """Where the model call's text streams: a chat turn's session, else nowhere."""
        if self._sessions is None:
            return contextlib.nullcontext(None)
        return self._sessions.text_sink(run, seq)

    async def _finish(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        status: str,
        finished: Finished,
        *,
        answer: str | None = None,
        error: tuple[str, str] | None = None,
        step: int | None = None,
    ) -> Effect:
        code, message = error if error else (None, None)
        # The run's last transaction: what is still due (its lease) is recorded before the
        # status, so the status's statement writes it too (`PlannerStore.writing_behind`).
        await self._budget.settle_deferred(conn)
        await self._store.set_status(
            conn, run, status, step=step, answer=answer, error_code=code, error_message=message
        )
        if self._sessions is not None:
            await self._sessions.ended(conn, run, status, answer=answer, code=code, steps=steps)
        if branch_of(run.manifest) is None:  # a branch's end is its caller's to observe
            finished.append((status, code))
        run = msgspec.structs.replace(
            run, status=status, answer=answer, error_code=code, error_message=message
        )
        return self._result(run, steps)

    def _result(
        self,
        run: RunRow,
        steps: list[Step],
        *,
        pending_id: str | None = None,
        proposal: ProposalView | None = None,
    ) -> Effect:
        return result_effect(run, steps, pending_id=pending_id, proposal=proposal)
