"""A session's turns on the planner's run loop: what the loop tells the session, in the run's
own transactions, and what follows their commits.

A turn is a run (`logic.turn_run_id`), governed like any other: the loop calls `gate` before
each new model decision (a paused session stops there, and injected messages become a step
the model sees), `record_steps` for the steps it committed, `observed` when a command's typed
outcome arrives (Writ writes the follow-up into the session: no model call), `waiting` when the
turn stops for a person, and `ended` when its run ends. After each commit `flush` publishes the
session's new events on `writ.chat.<tenant>.<session>`; `start` registers an accepted turn's
run with governance and hands it to retrieval; `sweep` does both again for anything a crash
left between a commit and what follows it (`_deliver.py`); `text_sink` streams a model
call's text (`_text.py`).
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, Final

import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from schemas.planner import branch_run_id
from schemas.sessions import (
    CapabilitySelected,
    ChildSession,
    DecisionAsked,
    DecisionTaken,
    Observed,
    ProposalMade,
    SessionOpened,
    StepAdmitted,
    StepDispatched,
    StepOutcome,
    TurnEnded,
    WriterNote,
)
from services.planner.deltas import DeltaBatcher
from services.planner.journal_entries import INJECTED, InjectedEntry
from services.planner.progress import step_recorded
from services.planner.sessions._deliver import SessionDelivery
from services.planner.sessions._inflight import InFlightCalls
from services.planner.sessions._plans import HELD_CODE, PAUSE_PREFIX, PLAN_PREFIX, Plans
from services.planner.sessions._resolve import PlanFacts
from services.planner.sessions._store import SessionRow, SessionStore
from services.planner.sessions._text import TurnText
from services.planner.sessions.logic import child_id_for, is_turn_run, transition, turn_of
from services.planner.snapshot import agent_call_target
from services.planner.store import PlannerStore, RunRow, Step

__all__ = ["SessionTurns", "outcome_note"]

log = logging.getLogger("writ.planner.sessions")
_MAX_NOTE: Final = 500
# The outcomes only the dispatcher's execution of a command reaches (it took the command off
# `writ.cmd` and called, or tried to call, the provider): they show it was dispatched. A
# denied or expired command never was; a revision required may be admission's finding.
_DISPATCHED: Final = frozenset({"succeeded", "failed", "unknown"})


def outcome_note(payload: dict[str, Any]) -> str:
    """What Writ writes into the conversation from a command's typed outcome (no model call):
    a success with its receipt, a recoverable outcome with its reason (the model's context at
    the next message), a terminal failure with its correlation id and nothing else."""
    action, state = payload.get("action", "the action"), payload.get("state")
    outcome = payload.get("outcome")
    if payload.get("refused"):  # never a command: denied, rejected (or unanswered), invalid
        return f"{action} was not run ({payload['refused']}): {payload.get('reason') or ''}"[
            :_MAX_NOTE
        ]
    if outcome == "terminal_failure" or (state == "failed" and payload.get("correlation_id")):
        return f"{action} failed; correlation id {payload.get('correlation_id')}"[:_MAX_NOTE]
    if state == "succeeded":
        receipt = payload.get("receipt")
        return (f"{action} succeeded" + (f" (receipt {receipt})" if receipt else ""))[:_MAX_NOTE]
    reason = payload.get("reason") or ""
    return f"{action} ended {outcome or state}: {reason}"[:_MAX_NOTE]


def _session_of_run(run: RunRow) -> str | None:
    if is_turn_run(run.run_id):
        return turn_of(run.run_id)[0]
    return None


class SessionTurns:
    """The session side of the planner's run loop."""

    def __init__(
        self,
        *,
        nc: Client,
        js: JetStreamContext,
        store: SessionStore,
        register_timeout_s: float = 2.0,
    ) -> None:
        self._store = store
        # (a plan step's preview reads the facts as admission does, from their readers)
        self.plans = Plans(sessions=store, facts=PlanFacts(nc=nc))
        self.in_flight = InFlightCalls(nc=nc)  # model calls a close abandons
        self.delivery = SessionDelivery(
            nc=nc, js=js, store=store, register_timeout_s=register_timeout_s
        )
        self._text = TurnText(js=js, store=store, in_flight=self.in_flight)
        # What follows the commits, and the loop's own work beside its inbox.
        self.flush, self.flush_run = self.delivery.flush, self.delivery.flush_run
        self.start, self.wake = self.delivery.start, self.delivery.wake
        self.progress, self.sweep = self.delivery.progress, self.delivery.sweep
        self.follow_admitted = self.delivery.follow_admitted

    @property
    def store(self) -> SessionStore:
        """The sessions' store."""
        return self._store

    async def _session_for(self, conn: Any, run: RunRow) -> SessionRow | None:
        """The session a run shows (a turn's, or a branch's child session), locked."""
        session_id = _session_of_run(run)
        if session_id is None:
            if not run.run_id.startswith("ses-"):
                return None
            session_id = await conn.fetchval(
                "SELECT session_id FROM planner.sessions WHERE branch_run_id = $1", run.run_id
            )
            if session_id is None:
                return None
        return await self._store.lock(conn, session_id)

    async def gate(self, conn: Any, run: RunRow, steps: list[Step]) -> bool:
        """Before a turn's next model decision: False if its session is paused (the turn stops
        here, recorded; a resume wakes it). Injected messages not seen yet become the run's
        next step, so the model sees them now."""
        if not is_turn_run(run.run_id):
            return True
        # Not locked: the model call that follows runs in this transaction, and a pause or an
        # inject must not wait for it.
        session = await self._store.get(conn, turn_of(run.run_id)[0])
        if session is None:
            return True
        if session.state == "paused":
            return False
        seq = steps[-1].seq + 1 if steps else 0
        taken = await self._store.take_injections(conn, session.session_id, run.run_id, seq)
        if taken:
            payload: dict[str, Any] = {"injected": [text for _, text in taken]}
            await conn.execute(
                "INSERT INTO planner.steps (run_id, seq, kind, payload) VALUES ($1, $2, "
                "'injected', $3::jsonb) ON CONFLICT DO NOTHING",
                run.run_id,
                seq,
                msgspec.json.encode(payload).decode(),
            )
            if self._store.journal is not None:
                await self._store.journal.write(
                    conn,
                    tenant=run.tenant,
                    kind=INJECTED,
                    subject=f"{run.run_id}/{seq}",
                    run_id=run.run_id,
                    payload=InjectedEntry(seq=seq, texts=payload["injected"]),
                )
            steps.append(Step(seq=seq, kind="injected", payload=payload))
        return True

    async def record_steps(self, conn: Any, run: RunRow, new: list[Step]) -> None:
        """The session events of steps the loop just recorded (in their transaction)."""
        if not new or not run.run_id.startswith("ses-"):
            return
        session = await self._session_for(conn, run)
        if session is None:
            return
        turn = session.turn if is_turn_run(run.run_id) else 1
        sid = session.session_id
        for step in new:
            source = f"step:{run.run_id}:{step.seq}"
            payload = step.payload
            if step.kind == "decision" and payload.get("decision") == "select_capability":
                capability = str(payload.get("capability", ""))[:512]
                session, _ = await self._store.add_event(
                    conn,
                    session,
                    source,
                    partial(_selected, sid, turn, step.seq, capability),
                )
                callee = agent_call_target(run.manifest, capability)
                if callee is not None:
                    session = await self._child(conn, session, run, step.seq, callee, turn)
            elif step.kind == "observation" and "operation_id" not in payload:
                # (a command's outcome is the session's `StepOutcome`, written as it arrives)
                summary = step_recorded(run.tenant, run.run_id, step).summary
                session, _ = await self._store.add_event(
                    conn,
                    session,
                    source,
                    partial(_observed, sid, turn, step.seq, summary),
                )

    async def _child(
        self, conn: Any, session: SessionRow, run: RunRow, step: int, callee: str, turn: int
    ) -> SessionRow:
        """An agent call of a turn: its branch run shows as a child session."""
        branch = branch_run_id(run.run_id, step)
        child_id = child_id_for(branch)
        if await self._store.create(
            conn,
            session_id=child_id,
            tenant=session.tenant,
            principal=session.principal,
            agent=callee,
            plan_mode=False,
            open_key=f"child:{branch}",
            state="processing",
            parent=session,
            branch_run_id=branch,
        ):
            child = await self._store.lock(conn, child_id)
            assert child is not None
            child = await self._store.move(conn, child, "processing", turn=1, turn_open=True)
            await self._store.add_event(
                conn,
                child,
                "opened",
                lambda n: SessionOpened(
                    session_id=child_id,
                    n=n,
                    agent=callee,
                    principal=session.principal,
                    parent_session_id=session.session_id,
                ),
            )
        session, _ = await self._store.add_event(
            conn,
            session,
            f"child:{branch}",
            lambda n: ChildSession(
                session_id=session.session_id,
                n=n,
                turn=turn,
                child_session_id=child_id,
                run_id=branch,
                agent=callee,
            ),
        )
        return session

    async def observed(
        self, conn: Any, run: RunRow, step: int, observation: dict[str, Any]
    ) -> None:
        """A command's typed outcome, written into the session by Writ (no model call)."""
        if "operation_id" not in observation:
            return
        session = await self._session_for(conn, run)
        if session is None:
            return
        turn = session.turn if is_turn_run(run.run_id) else 1
        sid = session.session_id
        text = outcome_note(observation)
        operation_id = str(observation["operation_id"])[:512]
        if run.status == "awaiting_human" and run.pending_id:
            # The turn waited for a person's approval of this command: it was given (an
            # approval over the proposals' door reaches the planner as the command's outcome).
            pending = run.pending_id[:512]
            session, _ = await self._store.add_event(
                conn,
                session,
                f"answered:{run.run_id}:{pending}",
                lambda n: DecisionTaken(
                    session_id=sid,
                    n=n,
                    turn=turn,
                    step=step,
                    pending_id=pending,
                    answer="approved",
                ),
            )
        # Admitted and dispatched, as the outcome shows them (the same source as the admitted
        # event heard live, `follow_admitted`: whichever comes first is the one recorded).
        session, _ = await self._store.add_event(
            conn,
            session,
            f"admitted:{run.run_id}:{step}",
            lambda n: StepAdmitted(
                session_id=sid, n=n, turn=turn, step=step, operation_id=operation_id
            ),
        )
        if observation.get("state") in _DISPATCHED:
            session, _ = await self._store.add_event(
                conn,
                session,
                f"dispatched:{run.run_id}:{step}",
                lambda n: StepDispatched(
                    session_id=sid,
                    n=n,
                    turn=turn,
                    step=step,
                    operation_id=operation_id,
                ),
            )
        session, _ = await self._store.add_event(
            conn,
            session,
            f"outcome:{run.run_id}:{step}",
            lambda n: StepOutcome(
                session_id=session.session_id,
                n=n,
                turn=turn,
                step=step,
                action=str(observation.get("action", ""))[:512],
                state=str(observation.get("state", ""))[:512],
                outcome=observation.get("outcome"),
                correlation_id=observation.get("correlation_id"),
                text=text,
            ),
        )
        await self._store.add_event(
            conn,
            session,
            f"note:{run.run_id}:{step}",
            lambda n: WriterNote(session_id=session.session_id, n=n, turn=turn, text=text),
        )

    async def refused(self, conn: Any, run: RunRow, step: int, observation: dict[str, Any]) -> None:
        """A turn's proposal that never became a command (a deny, a person's rejection, an
        attended ask nobody answered in 5 minutes): Writ writes why into the session."""
        session = await self._session_for(conn, run)
        if session is None:
            return
        turn = session.turn if is_turn_run(run.run_id) else 1
        text = outcome_note(observation)
        await self._store.add_event(
            conn,
            session,
            f"note:{run.run_id}:{step}",
            lambda n: WriterNote(session_id=session.session_id, n=n, turn=turn, text=text),
        )

    async def proposed(
        self,
        conn: Any,
        run: RunRow,
        step: int,
        action: str,
        proposal_id: str | None,
        preview: dict[str, Any],
    ) -> None:
        """A turn's proposal waits for a person's approval."""
        session = await self._session_for(conn, run)
        if session is None:
            return
        await self._store.add_event(
            conn,
            session,
            f"proposal:{run.run_id}:{step}",
            lambda n: ProposalMade(
                session_id=session.session_id,
                n=n,
                turn=session.turn,
                step=step,
                action=action[:512],
                proposal_id=proposal_id,
                preview=preview,
            ),
        )

    async def waiting(
        self, conn: Any, run: RunRow, step: int, pending_id: str | None, message: str
    ) -> None:
        """The turn stops for a person's decision: the session shows what it waits for."""
        session = await self._session_for(conn, run)
        if session is None or pending_id is None or pending_id.startswith(PLAN_PREFIX):
            return  # (a plan's wait is its `PlanProposed`)
        await self._store.add_event(
            conn,
            session,
            f"ask:{run.run_id}:{step}:{pending_id}",
            lambda n: DecisionAsked(
                session_id=session.session_id,
                n=n,
                turn=session.turn,
                step=step,
                pending_id=pending_id[:512],
                message=message[:512],
            ),
        )

    async def ended(
        self,
        conn: Any,
        run: RunRow,
        status: str,
        *,
        answer: str | None,
        code: str | None,
        steps: list[Step] | None = None,
    ) -> None:
        """The turn's run ended: the session takes its next message (or stays closed); under
        an approved plan, its end lists every step of the plan with its outcome."""
        session = await self._session_for(conn, run)
        if session is None:
            return
        outcomes = None if steps is None else await self.plans.outcomes(conn, run, steps)
        if is_turn_run(run.run_id):
            if not await self._store.end_turn(conn, run.run_id, status):
                return
            turn = turn_of(run.run_id)[1]
            if session.turn == turn and session.turn_open:
                session = await self._store.move(
                    conn, session, transition(session.state, "turn_ended"), turn_open=False
                )
        else:  # a child session: its one turn is the branch run
            turn = 1
            session = await self._store.move(conn, session, "closed", turn_open=False)
        await self._store.add_event(
            conn,
            session,
            f"ended:{run.run_id}",
            lambda n: TurnEnded(
                session_id=session.session_id,
                n=n,
                turn=turn,
                run_id=run.run_id,
                status=status,
                answer=answer,
                code=code,
                plan_steps=outcomes,
            ),
        )

    async def holds(self, conn: Any, run: RunRow) -> bool:
        """Whether a turn's recorded selection must wait before it is acted on: its session
        is paused (pause holds every effect not yet admitted; a resume wakes the turn)."""
        if not is_turn_run(run.run_id):
            return False
        session = await self._store.get(conn, turn_of(run.run_id)[0])
        return session is not None and session.state == "paused"

    async def hold(self, conn: Any, store: PlannerStore, run: RunRow, step: int) -> None:
        """A turn's selection at `step` recorded while its session is paused: the turn waits
        for the resume (whose wake takes it from here, `PAUSE_PREFIX`) and a close ends it
        without the selection ever reaching admission."""
        await store.set_status(
            conn,
            run,
            "awaiting_human",
            step=step,
            error_code=HELD_CODE,
            error_message="the session is paused: the selection waits for its resume",
            pending_id=f"{PAUSE_PREFIX}{run.run_id}"[:512],
        )

    def text_sink(self, run: RunRow, seq: int) -> AbstractAsyncContextManager[DeltaBatcher | None]:
        """Where a turn's model call at step `seq` streams its text (`TurnText.sink`)."""
        return self._text.sink(run, seq)


def _selected(sid: str, turn: int, step: int, capability: str, n: int) -> CapabilitySelected:
    return CapabilitySelected(session_id=sid, n=n, turn=turn, step=step, capability=capability)


def _observed(sid: str, turn: int, step: int, summary: str, n: int) -> Observed:
    return Observed(session_id=sid, n=n, turn=turn, step=step, summary=summary)
