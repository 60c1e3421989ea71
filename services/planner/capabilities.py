"""What the runtime does with a model's `select_capability`, once the decision is recorded.

A selection is checked before any handler runs (`snapshot.selection_outcome`: in `uses`,
`callable_by`, the arguments against the target's signature, the call depth and chain); a
refusal is recorded as the observation the next decision reads (`SelectionRefused`), never
executed. A checked selection is then, by what its target names in the run's catalog:

- an action: proposed to admission (`ProposeCommand`, after its capability call is reserved
  and the proposal journaled); its outcome or refusal arrives on the planner's inbox later;
- a read tool: read by retrieval (`reads.py`: request/reply on `writ.int.retrieval.read`, after
  governance's `decide` there), and its answer — the items, untrusted and bounded, or why
  nothing was read — is the next observation. A read governance asks a person about stops the
  run (`Waiting`, with the pending decision) until that person answers: allowed, the same read
  is made again with their answer as its approval; refused, the refusal is observed;
- another agent: decided by governance and, if allowed, run as a branch of the run
  (`branches.py`): a run of its own, started with a `BranchChanged` to the planner's inbox,
  whose end wakes the caller with another, and is observed by it (the answer, untrusted and
  bounded). A branch that stops for a person stops its caller too (`Waiting`, with the
  branch's pending decision), until the branch goes on.

Each reserves one capability call of the run's budget (`budgeting.py`) under the step's key, so a
redelivery reuses it; `NoBudget` from a reservation reaches the service, which stops the run.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from opentelemetry.trace import SpanKind, Tracer

from schemas import subjects
from schemas.planner import BranchChanged, ProposeCommand, branch_run_id
from schemas.retrieval import ReadCapability, ReadRefused, ReadResult
from services.planner.agents import AgentRegistry
from services.planner.branches import CallDecider, branch_run
from services.planner.budgeting import RunBudgets, step_key
from services.planner.effects import AGAIN, Effects
from services.planner.journal_entries import ProposalEntry
from services.planner.metrics import PlannerMetrics
from services.planner.observations import (
    AgentObserved,
    ReadObserved,
    SelectionRefused,
    observation_of,
)
from services.planner.pricing import priced_call
from services.planner.protocol import action_name
from services.planner.provider import SelectCapability
from services.planner.reads import ReadClient
from services.planner.snapshot import agent_call_target, read_target
from services.planner.store import TERMINAL_RUN, PlannerStore, RunRow, Step

__all__ = ["Capabilities", "Waiting", "waiting_on"]

log = logging.getLogger("writ.planner")


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """The capability call cannot go on before a person decides `pending_id`: the run stops."""

    pending_id: str | None
    message: str


def waiting_on(branch: RunRow) -> Waiting:
    """What a run whose call started `branch` waits for while the branch waits for a person."""
    return Waiting(
        pending_id=branch.pending_id,
        message=(
            f"agent {branch.agent} (branch {branch.run_id}) waits for a person: "
            f"{branch.error_message or ''}"
        )[:1000],
    )


class Capabilities:
    """Acts on a committed `select_capability`: refuses it, proposes, reads or calls."""

    def __init__(
        self,
        *,
        store: PlannerStore,
        budget: RunBudgets,
        reads: ReadClient,
        calls: CallDecider,
        agents: AgentRegistry,
        tracer: Tracer,
        metrics: PlannerMetrics,
    ) -> None:
        self._store, self._budget, self._reads, self._calls = store, budget, reads, calls
        self._agents, self._tracer, self._metrics = agents, tracer, metrics

    async def refuse(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        seq: int,
        decision: SelectCapability,
        refused: tuple[str, str],
    ) -> None:
        """Record the runtime's refusal `(check, reason)` of the selection at step `seq` as the
        next observation: nothing runs."""
        output = SelectionRefused(
            run_id=run.run_id,
            step=seq,
            target=decision.capability[:128],
            check=refused[0],
            reason=refused[1],
        )
        observation = observation_of(output)
        if await self._store.add_observation(
            conn,
            run,
            seq + 1,
            step=seq,
            output=msgspec.to_builtins(output),
            observation=observation,
        ):
            steps.append(Step(seq=seq + 1, kind="observation", payload=observation))
            self._metrics.selections_refused.labels(refused[0]).inc()
        log.info(
            "run %s step %d: %s refused before any handler (%s)",
            run.run_id,
            seq,
            decision.capability[:128],
            refused[0],
        )

    @staticmethod
    def proposes(run: RunRow, decision: SelectCapability) -> bool:
        """Whether acting on this checked selection is proposing an action to admission (not
        a read, not a branch): nothing leaves the planner before its transaction commits."""
        return (
            read_target(run.manifest, decision.capability) is None
            and agent_call_target(run.manifest, decision.capability) is None
        )

    async def act(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        seq: int,
        decision: SelectCapability,
        *,
        approval_id: str | None = None,
        plan_preview: str | None = None,
    ) -> Effects | Waiting | None:
        """Act on the checked selection at step `seq`; `AGAIN` once its output is observed,
        `Waiting` if it waits for a person. `approval_id`: a person's answer allowing this
        very read, after it was asked; `plan_preview`: the digest of the preview an approved
        plan showed for this action (admission holds the proposal to it).

        Raises:
            NoBudget: the capability call could not be reserved (nothing ran).
        """
        tool = read_target(run.manifest, decision.capability)
        if tool is not None:
            return await self._read(conn, run, steps, seq, tool, decision, approval_id)
        callee = agent_call_target(run.manifest, decision.capability)
        if callee is not None:
            return await self._call(conn, run, steps, seq, callee, decision)
        return await self._propose(conn, run, seq, decision, plan_preview)

    async def _propose(
        self,
        conn: Any,
        run: RunRow,
        seq: int,
        decision: SelectCapability,
        plan_preview: str | None = None,
    ) -> Effects:
        """Reserve the capability call (once per step), journal the proposal with that
        reservation, and send it to admission (again on a redelivery: same message id, same
        operation id)."""
        command = msgspec.structs.replace(_proposal(run, seq, decision), plan_preview=plan_preview)
        _, new = await self._budget.reserve(
            conn,
            run,
            step_key(run.run_id, seq, "capability"),
            capability_calls=1,
            priced=priced_call(command.action, command.arguments),
        )
        if new:
            await self._store.add_proposal(
                conn,
                run,
                ProposalEntry(step=seq, action=command.action, arguments=command.arguments),
            )
        return [(subjects.proposal(run.tenant), command, f"proposal:{run.run_id}:{seq}")]

    async def _read(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        seq: int,
        tool: str,
        decision: SelectCapability,
        approval_id: str | None = None,
    ) -> Effects | Waiting | None:
        """Reserve the capability call (once per step), have retrieval read, and record its
        answer as the next observation, journaled with it, settling the call. A read a person
        must allow is not observed: the call is settled (the reservation is not held across
        the wait) and the run waits; the read made again once they allowed it is the same
        call, under the same reservation key.

        Raises:
            ReadUnavailable: retrieval gave no final answer; the transaction rolls back (the
                decision stays committed) and the redelivery reads again under the same
                reservation, which governance keeps for the step's key.
        """
        key = step_key(run.run_id, seq, "capability")
        priced = priced_call(tool, decision.arguments)
        await self._budget.reserve(conn, run, key, capability_calls=1, priced=priced)
        ask = ReadCapability(
            tenant=run.tenant,
            run_id=run.run_id,
            principal=run.principal,
            agent=run.agent,
            tool=tool,
            arguments=decision.arguments,
            approval_id=approval_id,
        )
        with self._tracer.start_as_current_span("planner read", kind=SpanKind.CLIENT) as span:
            span.set_attribute("writ.read.tool", tool)
            answer = await self._reads.read(ask)
            span.set_attribute(
                "writ.read.outcome",
                answer.code.lower() if isinstance(answer, ReadRefused) else "read",
            )
        await self._budget.spent(conn, run, key, capability_calls=1)
        if isinstance(answer, ReadRefused) and answer.code == "ASK":
            self._metrics.reads.labels("ask").inc()
            log.info(
                "run %s step %d: %s waits for a person (%s)",
                run.run_id,
                seq,
                tool,
                answer.pending_id,
            )
            return Waiting(
                pending_id=answer.pending_id,
                message=f"{tool} needs a person's decision: {answer.reason}",
            )
        await self.observe_read(conn, run, steps, seq, tool, decision, answer)
        return AGAIN

    async def observe_read(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        seq: int,
        tool: str,
        decision: SelectCapability,
        answer: ReadResult | ReadRefused,
    ) -> None:
        """Record a read's final answer (the items, or why nothing was read) as the
        observation of step `seq`, journaled with it."""
        outcome = answer.code.lower() if isinstance(answer, ReadRefused) else "read"
        output = ReadObserved(
            run_id=run.run_id, step=seq, tool=tool, arguments=decision.arguments, answer=answer
        )
        observation = observation_of(output)
        if await self._store.add_observation(
            conn,
            run,
            seq + 1,
            step=seq,
            output=msgspec.to_builtins(output),
            observation=observation,
        ):
            steps.append(Step(seq=seq + 1, kind="observation", payload=observation))
            self._metrics.reads.labels(outcome).inc()
        log.info("run %s step %d: %s observed (%s)", run.run_id, seq, tool, outcome)

    async def _call(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        seq: int,
        callee: str,
        decision: SelectCapability,
    ) -> Effects | Waiting | None:
        """Call another agent as a branch of the run: reserve the capability call, have
        governance decide it, start the branch in this transaction (the call is then spent:
        the branch's own steps reserve what they use), and wake it; once the branch has ended,
        observe how. A redelivery finds the branch it started and neither decides nor reserves
        again.

        Raises:
            CallDecisionUnavailable: governance gave no answer; the transaction rolls back (the
                decision stays committed) and the redelivery asks again.
        """
        branch = await self._store.run(conn, branch_run_id(run.run_id, seq))
        if branch is None:
            key = step_key(run.run_id, seq, "capability")
            await self._budget.reserve(conn, run, key, capability_calls=1)
            request = str(decision.arguments.get("request", ""))
            verdict = await self._calls.decide(run, callee, request)
            agent = self._agents.get(callee)
            if verdict.verdict != "allow" or agent is None:
                outcome = (
                    "unknown_agent"
                    if verdict.verdict == "allow"
                    else ("denied" if verdict.verdict == "deny" else "ask")
                )
                reason = f"no manifest declares agent {callee}" if agent is None else verdict.reason
                await self._budget.spent(conn, run, key, capability_calls=1)
                return await self._observe_call(
                    conn,
                    run,
                    steps,
                    AgentObserved(
                        run_id=run.run_id,
                        step=seq,
                        agent=callee,
                        arguments=decision.arguments,
                        outcome=outcome,
                        reason=reason[:512],
                        pending_id=verdict.pending_id,
                    ),
                )
            branch = branch_run(run, seq, agent, decision.arguments)
            await self._store.create_branch(conn, branch)
            await self._budget.spent(conn, run, key, capability_calls=1)
            log.info(
                "run %s step %d: branch %s of agent %s started",
                run.run_id,
                seq,
                branch.run_id,
                callee,
            )
        if branch.status == "awaiting_human":
            return waiting_on(branch)
        if branch.status in TERMINAL_RUN:
            answered = branch.status == "succeeded"
            return await self._observe_call(
                conn,
                run,
                steps,
                AgentObserved(
                    run_id=run.run_id,
                    step=seq,
                    agent=callee,
                    arguments=decision.arguments,
                    outcome="answered" if answered else "failed",
                    branch=branch.run_id,
                    answer=branch.answer if answered else None,
                    reason=""
                    if answered
                    else f"{branch.error_code}: {branch.error_message or ''}"[:512],
                ),
            )
        return [
            (
                subjects.branch(run.tenant),
                BranchChanged(tenant=run.tenant, run_id=branch.run_id),
                f"branch:{branch.run_id}:start",
            )
        ]

    async def _observe_call(
        self, conn: Any, run: RunRow, steps: list[Step], output: AgentObserved
    ) -> Effects | None:
        observation = observation_of(output)
        if await self._store.add_observation(
            conn,
            run,
            output.step + 1,
            step=output.step,
            output=msgspec.to_builtins(output),
            observation=observation,
        ):
            steps.append(Step(seq=output.step + 1, kind="observation", payload=observation))
            self._metrics.agent_calls.labels(output.outcome).inc()
        log.info(
            "run %s step %d: the call of %s observed (%s)",
            run.run_id,
            output.step,
            output.agent,
            output.outcome,
        )
        return AGAIN


def _proposal(run: RunRow, step: int, decision: SelectCapability) -> ProposeCommand:
    return ProposeCommand(
        run_id=run.run_id,
        step=step,
        tenant=run.tenant,
        principal=run.principal,
        agent=run.agent,
        action=action_name(decision.capability)[:512],
        arguments=decision.arguments,
    )
