"""Planner: the model loop. It proposes; it never acts and never holds a credential.

Each delivery advances one run under a row lock (`advance.py`): record what arrived (evidence, an
outcome, a refusal, a branch's change, a person's answer to the read the run waits for), take the
next model decision (`steps.py`) — reusing the recorded one if this step was already decided —
and publish what follows after the commit (`effects.py`). A redelivery re-publishes
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
  read, proposal or branch waits for a person's decision (`waits.py`, the decision's id in
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

import logging
import time
from typing import Any, cast, get_args

import anyio
import anyio.abc
import msgspec

from libs.actor import Delivery, run_actor
from libs.bus import ConsumerSpec, publish
from libs.errors import RetryableError
from libs.journal import Sealer
from libs.runtime import Endpoint, Runtime
from schemas import subjects
from schemas.admission import CommandAdmitted
from schemas.control import RunCancelRequested
from schemas.dispatcher import CommandOutcome, CommandState
from schemas.governance import DecisionAnswered, LeaseAmounts
from schemas.host import RunResult
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
from services.planner.advance import Inbound, RunAdvance
from services.planner.agents import AgentRegistry
from services.planner.branches import CallDecider
from services.planner.budgeting import RunBudgets
from services.planner.cancel import record_cancel
from services.planner.capabilities import Capabilities
from services.planner.codes import BUDGET_CODE
from services.planner.critic import Critic
from services.planner.effects import AGAIN, Effects, Finished
from services.planner.endpoints import ReplayEndpoint, ReviewEndpoint
from services.planner.mcp_catalog import with_mcp_descriptions
from services.planner.metrics import PlannerMetrics
from services.planner.progress import announce
from services.planner.provider import (
    DecisionProvider,
)
from services.planner.reads import ReadClient
from services.planner.review import record_answer
from services.planner.sessions import SessionOpsEndpoint, SessionTurns
from services.planner.sessions.logic import is_turn_run
from services.planner.snapshot import (
    snapshot_of,
)
from services.planner.status import ReviewsEndpoint, RunEventsEndpoint, RunStatusEndpoint
from services.planner.steps import RunSteps
from services.planner.store import (
    TERMINAL_RUN,
    PlannerStore,
    last_command,
    last_refusal,
    pending_answer,
    results_sent,
)
from services.planner.sweeper import SWEEP_CONCURRENCY, RunSweeper

__all__ = ["CONCURRENCY", "PlannerService", "pool_size"]

# Deliveries one planner handles at once: at least the runs a host keeps in flight (the bench
# keeps 32), since a run's delivery waits on governance's budget replies, not on CPU.
CONCURRENCY = 32
# Connections beyond one per delivery in flight: the sealer, the review and replay endpoints.
POOL_HEADROOM = 4 + 8 + SWEEP_CONCURRENCY  # and the chat sessions', and the run sweeper
INBOX = ConsumerSpec(stream="WRIT_INT", durable="planner", filter_subjects=subjects.PLANNER_IN)
log = logging.getLogger("writ.planner")
_ENDED = frozenset(get_args(CommandState))  # a command's states once it ended


def pool_size(concurrency: int = CONCURRENCY) -> int:
    """The connections a planner handling `concurrency` deliveries at once needs: one each,
    held for the whole delivery, and the headroom its sealer and endpoints use."""
    return concurrency + POOL_HEADROOM


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
        sweep_stall_s: float = 20.0,
        sweep_every_s: float = 5.0,
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
        self._replay = ReplayEndpoint(rt=rt, store=store)
        # Runs stalled on a message the bus lost are driven again from the database.
        self._sweeper = RunSweeper(
            store=store,
            drive=self.redrive,
            resend=self.resend_result,
            metrics=self._metrics,
            stall_s=sweep_stall_s,
            every_s=sweep_every_s,
        )
        self._steps = RunSteps(
            store=store,
            provider=provider,
            agents=agents,
            budget=self._budget,
            capabilities=self._capabilities,
            critic=Critic(
                store=store,
                budget=self._budget,
                provider=provider,
                tracer=rt.tracer,
                reserve_tokens=reserve_tokens,
            ),
            sessions=sessions,
            tracer=rt.tracer,
            max_decisions=max_decisions,
            reserve_tokens=reserve_tokens,
        )
        self._advance = RunAdvance(
            nc=rt.nc,
            faults=rt.faults,
            store=store,
            budget=self._budget,
            sessions=sessions,
            steps=self._steps,
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
                tg.start_soon(self._sweeper.run)  # runs whose message the bus lost
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
                    outage_limit_s=self._rt.outage_limit_s,
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
        await self._drive(event)

    async def redrive(self, tenant: str, run_id: str) -> None:
        """Drive a run whose progress stalled, from the database (`sweeper.py`): the outcome
        of the command its last step proposed, if that command ended (its message was lost);
        nothing, if the command has not ended (the dispatcher's sweeper drives it); what
        admission answered that step's proposal if it did not become a command (a refusal,
        a person's rejection, an ask); the answer governance recorded, if the run waits on a
        read a person answered; else a wake delivered in-process, whose proposal or wake gets
        the sweep's message ids."""
        async with self._store.acquire() as conn:
            answer = await pending_answer(conn, tenant, run_id)
            command = await last_command(conn, tenant, run_id)
            refusal = None if command is not None else await last_refusal(conn, tenant, run_id)
        if answer is not None:  # a person's answer to the read the run waits on
            await self._drive(answer)
        elif refusal is not None:  # observed once: the run's row lock, as a redelivery's
            await self._drive(refusal)
        elif command is None:
            await self._drive(
                BranchChanged(tenant=tenant, run_id=run_id), again=f":swept:{time.time_ns()}"
            )
        elif command.state in _ENDED:
            await self._drive(
                CommandOutcome(
                    tenant=tenant,
                    operation_id=command.operation_id,
                    run_id=run_id,
                    step=command.step,
                    action=command.action,
                    state=cast(CommandState, command.state),
                    receipt=command.receipt,
                    reason=(command.reason or "")[:500] or None,
                )
            )

    async def resend_result(self, tenant: str, run_id: str) -> None:
        """Publish an ended run's result again (`sweeper.py`): a wake of an ended run
        publishes only that, under its first message id."""
        await self._drive(BranchChanged(tenant=tenant, run_id=run_id))

    async def _drive(self, event: Inbound, *, again: str = "") -> None:
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
                    effects = await self._advance.advance(conn, event, finished)
                    await self._committed(finished, effects, again=again, conn=conn)

    async def _committed(
        self, finished: Finished, effects: Effects, *, again: str = "", conn: Any = None
    ) -> None:
        # Committed: count each run's end once. A redelivery re-publishes a terminal run's
        # result through the replay path, which finishes nothing and is not counted again.
        # `again`: a sweep's suffix for the ids of what Writ sends itself (a proposal, a
        # wake), which the stream would otherwise drop as the duplicates of lost messages.
        for status, code in finished:
            self._metrics.finished.labels(status).inc()
            if code == BUDGET_CODE:
                self._metrics.budget_exhausted.inc()
        if any(isinstance(m, ProposeCommand) for _, m, _ in effects):
            # Armed by the fault suite: the decision and its reservation are committed, the
            # proposal is not published yet (the redelivery publishes it, the model unasked).
            self._rt.faults.crash_if("planner.before_proposal")
        ended = [
            m.run_id
            for _, m, _ in effects
            if isinstance(m, RunResult) and m.run_id is not None and m.status in TERMINAL_RUN
        ]
        if ended:
            # Armed by the fault suite: the run's end is committed, its result not published.
            self._rt.faults.crash_if("planner.before_result")
        for subject, message, msg_id in effects:
            if again and isinstance(message, ProposeCommand | BranchChanged):
                msg_id += again
            await publish(self._rt.js, subject, message, msg_id=msg_id)
        if ended:  # out: the sweeper has nothing to publish again for them
            if conn is not None:
                await results_sent(conn, ended)
            else:
                async with self._store.acquire() as own:
                    await results_sent(own, ended)

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
                        await self._steps.finish(
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
                    effects = await self._advance.continue_run(conn, run.run_id, effects, finished)
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
