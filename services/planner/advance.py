"""One delivery applied to its run: lock it, record what arrived (evidence, an outcome, a
refusal, a branch's change, a person's answer, a cancel), then take its next steps, each in a
transaction of its own (`RunSteps`, `steps.py`), and announce what each committed. A
collaborator of `PlannerService` (`service.py`)."""

from __future__ import annotations

from typing import Any

import msgspec
from nats.aio.client import Client as NATS

from libs.faults import Faults
from schemas.admission import CommandAdmitted, ProposalRefused
from schemas.control import CANCEL_CODE, RunCancelRequested
from schemas.dispatcher import CommandOutcome
from schemas.governance import DecisionAnswered
from schemas.planner import BranchChanged
from schemas.retrieval import EvidenceGathered
from services.planner.budgeting import RunBudgets, step_key
from services.planner.cancel import in_flight
from services.planner.capabilities import waiting_on
from services.planner.effects import AGAIN, Effects, Finished
from services.planner.observations import observation_of
from services.planner.pricing import not_carried_out
from services.planner.progress import announce
from services.planner.sessions import SessionTurns
from services.planner.sessions._plans import PAUSE_PREFIX
from services.planner.steps import RunSteps
from services.planner.store import TERMINAL_RUN, PlannerStore, RunRow, Step

__all__ = ["Inbound", "RunAdvance"]

Inbound = (
    EvidenceGathered
    | CommandOutcome
    | CommandAdmitted
    | ProposalRefused
    | BranchChanged
    | DecisionAnswered
    | RunCancelRequested
)


class RunAdvance:
    """Applies deliveries (and wakes) to their runs."""

    def __init__(
        self,
        *,
        nc: NATS,
        faults: Faults,
        store: PlannerStore,
        budget: RunBudgets,
        sessions: SessionTurns | None,
        steps: RunSteps,
    ) -> None:
        self._nc, self._faults, self._store, self._budget = nc, faults, store, budget
        self._sessions, self._steps = sessions, steps

    async def advance(self, conn: Any, event: Inbound, finished: Finished) -> Effects:
        """Record what arrived and take the run's steps from there, each committed in turn;
        what to publish once they are."""
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
        await announce(self._nc, run, steps[seen:])
        try:
            return await self.continue_run(conn, run.run_id, effects, finished)
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
            key = step_key(run.run_id, event.step, "capability")
            await self._budget.spent(conn, run, key, capability_calls=1)
            if not_carried_out(event):  # nothing acted: its spend charge is given back
                await self._budget.credit(conn, run, key)
        if run.status not in TERMINAL_RUN and (by := cancelled):
            if (
                run.status == "running"
                and in_flight(steps)
                and not isinstance(event, ProposalRefused)
            ):
                return []  # an admitted command runs to its outcome, observed before the end
            return [
                await self._steps.finish(
                    conn,
                    run,
                    steps,
                    "cancelled",
                    finished,
                    error=(CANCEL_CODE, f"cancelled by {by}"),
                )
            ]
        if isinstance(event, DecisionAnswered):
            return await self._steps.waits.answered(conn, run, steps, event, finished)
        if run.status in TERMINAL_RUN:
            return [self._steps.result(run, steps)]
        if isinstance(event, ProposalRefused):
            return await self._steps.waits.refused(conn, run, steps, event, finished)
        if (
            run.status == "awaiting_human"
            and isinstance(event, BranchChanged)
            and self._sessions is not None
            and (run.pending_id or "").startswith("plan-")
        ):
            return await self._steps.waits.plan_answered(conn, run, steps, finished)
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
            return await self._steps.next(conn, run, steps, finished)
        if run.status == "awaiting_human":
            if isinstance(event, BranchChanged):
                # A run waiting on a branch that waited for a person: it goes on once the
                # branch does (its call is then observed), or waits on for what the branch
                # waits for now.
                branch = await self._steps.waits.waited_branch(conn, run, steps)
                if branch is None:
                    return []
                if branch.status == "awaiting_human":
                    waiting = waiting_on(branch)
                    return await self._steps.waits.wait_for_person(
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
        if not steps and (refusal := self._steps.agent_refusal(run)) is not None:
            return [await self._steps.finish(conn, run, steps, "failed", finished, error=refusal)]
        return await self._steps.next(conn, run, steps, finished)

    async def continue_run(
        self, conn: Any, run_id: str, effects: Effects | None, finished: Finished
    ) -> Effects:
        """Take the decisions the runtime answers itself, each in its own transaction, so each
        step is committed before the next decision is asked for."""
        while effects is AGAIN:
            # Armed by the fault suite: a step (a model decision) is committed and nothing
            # that follows it has started.
            self._faults.crash_if("planner.after_decision")
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
                        await self._steps.finish(
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
                effects = await self._steps.next(conn, run, steps, finished)
                if effects is not AGAIN:  # the delivery's last transaction
                    await self._budget.settle_deferred(conn)
                if self._sessions is not None:
                    await self._sessions.record_steps(conn, run, steps[seen:])
                await self._budget.flush(conn)  # before it commits: what was written behind
            await announce(self._nc, run, steps[seen:])
        return effects
