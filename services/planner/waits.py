"""The planner's waits for a person (docs/design.md invariant 8): a run stops for a decision — a
read or proposal governance asked about, a branch that waits, a plan-mode turn's plan — and
goes on from its recorded step once the answer (or the outcome it leads to) arrives. A
collaborator of `PlannerService` (`service.py`): it holds the store, capabilities, budgets and
sessions it acts through, and is handed the loop's next step, its finish and its result."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from schemas.admission import ProposalRefused
from schemas.governance import DecisionAnswered
from schemas.host import ProposalView
from schemas.planner import branch_run_id
from schemas.retrieval import ReadRefused
from services.planner.budgeting import RunBudgets, step_key
from services.planner.capabilities import Capabilities, Waiting
from services.planner.codes import REFUSAL_CODES
from services.planner.effects import AGAIN, Effects, Finished
from services.planner.provider import ModelDecision, SelectCapability
from services.planner.sessions import SessionTurns
from services.planner.sessions._plans import PLAN_REJECTED, model_payload
from services.planner.snapshot import agent_call_target, branch_of, read_target
from services.planner.store import PlannerStore, RunRow, Step

__all__ = ["PersonWaits"]

log = logging.getLogger("writ.planner")
_DECISION_DECODER = msgspec.json.Decoder(ModelDecision)


class PersonWaits:
    """Where a run waits for a person, and what their answer leads to."""

    def __init__(
        self,
        *,
        store: PlannerStore,
        capabilities: Capabilities,
        budget: RunBudgets,
        sessions: SessionTurns | None,
        next_step: Callable[..., Awaitable[Effects | None]],
        finish: Callable[..., Awaitable[Any]],
        result: Callable[..., Any],
    ) -> None:
        self._store, self._capabilities, self._budget = store, capabilities, budget
        self._sessions = sessions
        self._next, self._finish, self._result = next_step, finish, result

    async def answered(
        self, conn: Any, run: RunRow, steps: list[Step], event: DecisionAnswered, finished: Finished
    ) -> Effects | None:
        """A person answered the read the run stopped for (`capabilities.Waiting`): allowed,
        the same read is made again with the answer as its approval, and its answer observed;
        refused, the refusal is the observation. Either way the agent decides next. An answer
        to anything else the run does not wait for now changes nothing.

        Raises:
            ReadUnavailable: retrieval gave no final answer; the transaction rolls back (the
                run still waits) and the answer's redelivery reads again.
        """
        last = steps[-1] if steps else None
        if (
            run.status != "awaiting_human"
            or run.pending_id != event.pending_id
            or last is None
            or last.kind != "decision"
        ):
            return []
        decision = _DECISION_DECODER.decode(msgspec.json.encode(model_payload(last.payload)))
        if (
            not isinstance(decision, SelectCapability)
            or (tool := read_target(run.manifest, decision.capability)) is None
        ):
            return []
        await self._store.set_status(conn, run, "running", step=last.seq)
        run = msgspec.structs.replace(
            run, status="running", error_code=None, error_message=None, pending_id=None
        )
        log.info(
            "run %s step %d: %s answered %s by %s",
            run.run_id,
            last.seq,
            tool,
            event.answer,
            event.answered_by,
        )
        if event.answer == "deny":
            await self._capabilities.observe_read(
                conn,
                run,
                steps,
                last.seq,
                tool,
                decision,
                ReadRefused(
                    run_id=run.run_id,
                    tool=tool,
                    code="DENIED",
                    reason=f"a person refused the read: {event.reason}"[:500],
                    decision_id=event.decision_id,
                    line=event.line,
                ),
            )
            return AGAIN
        acted = await self._capabilities.act(
            conn, run, steps, last.seq, decision, approval_id=event.decision_id
        )
        if isinstance(acted, Waiting):  # asked again (the policy changed meanwhile)
            return await self.wait_for_person(
                conn,
                run,
                steps,
                finished,
                step=last.seq,
                pending_id=acted.pending_id,
                message=acted.message,
            )
        return acted

    async def waited_branch(self, conn: Any, run: RunRow, steps: list[Step]) -> RunRow | None:
        """The branch a waiting run's last decision called, if that is what it waits on."""
        last = steps[-1] if steps else None
        if (
            last is None
            or last.kind != "decision"
            or (last.payload.get("decision") != "select_capability")
        ):
            return None
        if agent_call_target(run.manifest, str(last.payload.get("capability", ""))) is None:
            return None
        return await self._store.run(conn, branch_run_id(run.run_id, last.seq))

    async def wait_for_person(
        self,
        conn: Any,
        run: RunRow,
        steps: list[Step],
        finished: Finished,
        *,
        step: int,
        pending_id: str | None,
        message: str,
        proposal: ProposalView | None = None,
    ) -> Effects:
        """The run stops for a person's decision (`pending_id`). Someone watching: it waits
        for their answer. Unattended: the run stops here and lists the pending decision."""
        version = await self._store.set_status(
            conn,
            run,
            "awaiting_human",
            step=step,
            error_code="AWAITING_HUMAN",
            error_message=message,
            pending_id=pending_id,
        )
        if self._sessions is not None:
            if proposal is not None:
                await self._sessions.proposed(
                    conn, run, step, proposal.action, proposal.proposal_id, proposal.preview
                )
            await self._sessions.waiting(conn, run, step, pending_id, message)
        if run.attended:
            return []  # someone is watching: the run waits for their answer
        if run.status != "awaiting_human" and branch_of(run.manifest) is None:
            finished.append(("awaiting_human", "AWAITING_HUMAN"))  # not the same wait again
        run = msgspec.structs.replace(
            run,
            status="awaiting_human",
            error_code="AWAITING_HUMAN",
            error_message=message,
            pending_id=pending_id,
            state_version=run.state_version if version is None else version,
        )
        return [self._result(run, steps, pending_id=pending_id, proposal=proposal)]

    async def plan_answered(
        self, conn: Any, run: RunRow, steps: list[Step], finished: Finished
    ) -> Effects | None:
        """A plan-mode turn woken while its plan waits: approved, it acts (the approval is
        its next observation); rejected, it ends `REJECTED` with the user's reason."""
        assert self._sessions is not None
        answer = await self._sessions.plans.answered(conn, self._store, run, steps)
        if answer is None:
            return []  # still proposed
        if answer == "rejected":
            reason = await self._sessions.plans.reason(conn, run.pending_id or "")
            return [
                await self._finish(
                    conn,
                    run,
                    steps,
                    "failed",
                    finished,
                    error=("REJECTED", reason or PLAN_REJECTED),
                )
            ]
        await self._store.set_status(conn, run, "running", step=steps[-1].seq)
        run = msgspec.structs.replace(
            run, status="running", error_code=None, error_message=None, pending_id=None
        )
        return await self._next(conn, run, steps, finished)

    async def refused(
        self, conn: Any, run: RunRow, steps: list[Step], event: ProposalRefused, finished: Finished
    ) -> Effects | None:
        if event.verdict == "ask":
            # The run stops for a person: its capability call is over for the budget (the
            # reservation is not held across the wait; governance's clock pauses meanwhile).
            await self._budget.spent(
                conn, run, step_key(run.run_id, event.step, "capability"), capability_calls=1
            )
            proposal = None
            if event.proposal_id is not None:
                proposal = ProposalView(
                    proposal_id=event.proposal_id,
                    action=event.action,
                    preview=event.preview or {},
                    expires_at=event.expires_at or "",
                )
            return await self.wait_for_person(
                conn,
                run,
                steps,
                finished,
                step=event.step,
                pending_id=event.pending_id,
                message=f"{event.action} needs a person's decision: {event.reason}",
                proposal=proposal,
            )
        if event.verdict == "revise":
            # An approver sent the proposal back: nothing ran, and the run goes on in the same
            # run, the model's next call given their reason as its revision context (observed
            # already; `inputs.revision_of`). A revised command is proposed and approved anew.
            await self._store.set_status(conn, run, "running", step=steps[-1].seq)
            run = msgspec.structs.replace(
                run, status="running", error_code=None, error_message=None, pending_id=None
            )
            return await self._next(conn, run, steps, finished)
        # A refusal fails the run; the agent is not called again for it.
        return [
            await self._finish(
                conn,
                run,
                steps,
                "failed",
                finished,
                step=event.step,
                error=(REFUSAL_CODES[event.verdict], event.reason),
            )
        ]
