"""A session's turns on the planner's run loop: what the loop tells the session, in the run's
own transactions, and what follows their commits.

A turn is a run (`logic.turn_run_id`), governed like any other: the loop calls `gate` before
each new model decision (a paused session stops there, and injected messages become a step
the model sees), `record_steps` for the steps it committed, `observed` when a command's typed
outcome arrives (Writ writes the follow-up into the session: no model call), `waiting` when the
turn stops for a person, and `ended` when its run ends. After each commit `flush` publishes the
session's new events on `writ.chat.<tenant>.<session>`; `start` registers an accepted turn's
run with governance and hands it to retrieval; `sweep` does both again for anything a crash
left between a commit and what follows it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final

import anyio
import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.bus import publish
from libs.runstart import start_run
from schemas import subjects
from schemas.admission import CommandAdmitted
from schemas.governance import RegisterTurn
from schemas.planner import BranchChanged, branch_run_id
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
    TextDelta,
    TextReset,
    TurnEnded,
    WriterNote,
    chat_subject,
)
from services.planner.deltas import AttemptReset, DeltaBatcher, TextBatch
from services.planner.journal_entries import INJECTED, InjectedEntry
from services.planner.progress import step_recorded
from services.planner.sessions._inflight import InFlightCalls, ModelCallAbandoned, cancelled_before
from services.planner.sessions._listen import listen
from services.planner.sessions._plans import HELD_CODE, PAUSE_PREFIX, PLAN_PREFIX, Plans
from services.planner.sessions._resolve import PlanFacts
from services.planner.sessions._store import SessionRow, SessionStore, TurnRow
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
# Whoever of the planner's replicas takes an admitted event: one of them records it.
_ADMITTED_QUEUE: Final = "planner-sessions"


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
        self._nc, self._js, self._store = nc, js, store
        self._register_timeout = register_timeout_s
        # (a plan step's preview reads the facts as admission does, from their readers)
        self.plans = Plans(sessions=store, facts=PlanFacts(nc=nc))
        self.in_flight = InFlightCalls(nc=nc)  # model calls a close abandons

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

    @asynccontextmanager
    async def text_sink(self, run: RunRow, seq: int) -> AsyncIterator[DeltaBatcher | None]:
        """Where a turn's model call at step `seq` streams its text: batched deltas on the
        session's subject (not numbered, not stored: the answer is, once decided). None for a
        run that is no session's turn.

        Raises:
            ModelCallAbandoned: the session closed during the call, which was cancelled (its
                text reset on the stream); nothing of it is to be recorded.

        A call for a step that an earlier call (in a process that died) began first publishes
        a reset, so a client drops text the new call replaces.
        """
        if not is_turn_run(run.run_id):
            yield None
            return
        session_id, turn = turn_of(run.run_id)
        subject = chat_subject(run.tenant, session_id)
        call = uuid.uuid4().hex[:12]  # this call's deltas are its own, whatever came before

        async def out(item: TextBatch | AttemptReset) -> None:
            try:
                if isinstance(item, TextBatch):
                    await publish(
                        self._js,
                        subject,
                        TextDelta(
                            session_id=session_id,
                            n=0,
                            turn=turn,
                            step=seq,
                            attempt=item.attempt,
                            index=item.index,
                            text=item.text,
                        ),
                        msg_id=f"delta:{run.run_id}:{seq}:{call}:{item.attempt}:{item.index}",
                    )
                else:
                    await publish(
                        self._js,
                        subject,
                        TextReset(
                            session_id=session_id,
                            n=0,
                            turn=turn,
                            step=seq,
                            attempt=item.attempt,
                            reason=item.reason[:512],
                        ),
                        msg_id=f"reset:{run.run_id}:{seq}:{call}:{item.attempt}",
                    )
            except Exception as exc:  # text is progress: the decision is what is recorded
                log.debug("turn %s step %d: text not published: %r", run.run_id, seq, exc)

        batcher = DeltaBatcher(out)
        abandoned = False
        # The session's close cancels the call (`_inflight.py`): its text so far is reset.
        with self.in_flight.watch(run.run_id) as scope:
            calls, cancelled = await self._model_calls(run.run_id, seq)
            if calls > 1:
                await out(AttemptReset(attempt=0, reason="the model is asked again for this step"))
            if cancelled:
                scope.cancel()  # closed before this call registered: it never starts
            async with anyio.create_task_group() as tg:
                await tg.start(batcher.run)
                try:
                    with scope:
                        yield batcher
                        await batcher.flush()
                    if scope.cancelled_caught:
                        abandoned = True
                        await batcher.reset("the session closed: this answer was abandoned")
                finally:
                    tg.cancel_scope.cancel()
        if abandoned:
            raise ModelCallAbandoned(run.run_id)

    async def _model_calls(self, run_id: str, seq: int) -> tuple[int, bool]:
        """Count a model call begun for the step, committed at once, and say whether the run
        was cancelled already ((0, False) if the pool is busy: the call goes on without it)."""
        try:
            async with self._store.acquire_soon() as conn:
                calls = int(
                    await conn.fetchval(
                        "INSERT INTO planner.session_model_calls (run_id, seq) VALUES ($1, $2) "
                        "ON CONFLICT (run_id, seq) DO UPDATE SET calls = "
                        "planner.session_model_calls.calls + 1 RETURNING calls",
                        run_id,
                        seq,
                    )
                )
                return calls, await cancelled_before(conn, run_id)
        except (TimeoutError, OSError) as exc:
            log.debug("turn %s step %d: model call not counted: %r", run_id, seq, exc)
            return 0, False

    async def progress(
        self,
        *,
        tenant: str,
        run_id: str,
        step: int | None = None,
        operation_id: str | None = None,
        pending_id: str | None = None,
        answer: str | None = None,
    ) -> None:
        """What the planner hears of a turn's proposal without a step of its own — admitted
        as a command, or a person's answer to its ask — as the session's event; progress
        only: a failure to record it changes nothing in the turn."""
        if not is_turn_run(run_id):
            return
        session_id, turn = turn_of(run_id)
        try:
            async with self._store.acquire() as conn, conn.transaction():
                session = await self._store.lock(conn, session_id)
                if session is None or session.tenant != tenant:
                    return
                if step is None:
                    step = int(
                        await conn.fetchval(
                            "SELECT coalesce(max(seq), 0) FROM planner.steps WHERE run_id = $1",
                            run_id,
                        )
                    )
                at = step
                if operation_id is not None:
                    await self._store.add_event(
                        conn,
                        session,
                        f"admitted:{run_id}:{at}",
                        lambda n: StepAdmitted(
                            session_id=session_id,
                            n=n,
                            turn=turn,
                            step=at,
                            operation_id=operation_id,
                        ),
                    )
                elif pending_id is not None and answer is not None:
                    await self._store.add_event(
                        conn,
                        session,
                        f"answered:{run_id}:{pending_id}",
                        lambda n: DecisionTaken(
                            session_id=session_id,
                            n=n,
                            turn=turn,
                            step=at,
                            pending_id=pending_id[:512],
                            answer=answer[:512],
                        ),
                    )
            await self.flush(session_id)
        except Exception as exc:
            log.warning("turn %s: progress not recorded: %r", run_id, exc)

    async def follow_admitted(self) -> None:
        """Hear admission's `CommandAdmitted` progress events (core NATS, in no stream: one
        lost is no loss, the outcome records the admission too) and show a turn's as its
        session's `StepAdmitted` while the command is still on its way."""

        async def heard(event: CommandAdmitted) -> None:
            await self.progress(
                tenant=event.tenant,
                run_id=event.run_id,
                step=event.step,
                operation_id=event.operation_id,
            )

        await listen(
            self._nc,
            subjects.admitted("*"),
            msgspec.json.Decoder(CommandAdmitted),
            subjects.admitted,
            heard,
            queue=_ADMITTED_QUEUE,
        )

    # --- after the commit ------------------------------------------------------------------

    async def flush(self, session_id: str) -> None:
        """Publish the session's events not yet on its subject, in order (a duplicate of one
        already published is dropped by its `Nats-Msg-Id`)."""
        async with self._store.acquire() as conn:
            session = await self._store.get(conn, session_id)
            if session is None or session.published_n >= session.last_n:
                return
            events = await self._store.events(conn, session_id, after=session.published_n)
            subject = chat_subject(session.tenant, session_id)
            for event in events:
                await publish(self._js, subject, event, msg_id=f"chat:{session_id}:{event.n}")
            if events:
                await self._store.mark_published(conn, session_id, events[-1].n)

    async def flush_run(self, run_id: str) -> None:
        """`flush` the session a run shows, if any; a failure is left to the sweep."""
        if not run_id.startswith("ses-"):
            return
        try:
            if is_turn_run(run_id):
                await self.flush(turn_of(run_id)[0])
            else:
                async with self._store.acquire() as conn:
                    session_id = await conn.fetchval(
                        "SELECT session_id FROM planner.sessions WHERE branch_run_id = $1", run_id
                    )
                    parent = await conn.fetchval(
                        "SELECT parent_session_id FROM planner.sessions WHERE session_id = $1",
                        session_id,
                    )
                for sid in (session_id, parent):
                    if sid is not None:
                        await self.flush(sid)
        except Exception as exc:
            log.warning("session events of run %s not published yet: %r", run_id, exc)

    async def start(self, session: SessionRow, turn: TurnRow) -> None:
        """Register the turn's run with governance (attended: a person is in the chat; no
        grants: the planner may not give any) and hand it on with its evidence, as ingress
        starts a host's run (`libs/runstart.py`).

        Raises:
            RetryableError: governance or retrieval did not answer (the sweep tries again).
        """
        await start_run(
            self._nc,
            self._js,
            RegisterTurn(
                tenant=session.tenant,
                run_id=turn.run_id,
                session_id=session.session_id,
                principal=session.principal,
                agent=session.agent,
            ),
            request_id=turn.run_id,
            text=turn.input,
            timeout=self._register_timeout,
        )
        async with self._store.acquire() as conn:
            await self._store.mark_started(conn, turn.run_id)

    async def wake(self, tenant: str, run_id: str, why: str) -> None:
        """Have the planner's inbox drive a turn's run again (after a resume or a close)."""
        await publish(
            self._js,
            subjects.branch(tenant),
            BranchChanged(tenant=tenant, run_id=run_id),
            msg_id=f"wake:{run_id}:{why}",
        )

    async def wake_in_flight(self) -> int:
        """At start: wake every turn a session is `processing` whose run is running (the seed
        admits it leaves them; Writ continues them from their recorded steps). Their own
        deliveries would too, once their ack wait runs out; a turn woken twice does nothing
        twice. Returns how many were woken."""
        async with self._store.acquire() as conn:
            rows = await conn.fetch(
                "SELECT t.run_id, s.tenant FROM planner.session_turns t "
                "JOIN planner.sessions s USING (session_id) "
                "JOIN planner.runs r ON r.run_id = t.run_id "
                "WHERE s.state = 'processing' AND t.status = 'running' "
                "AND r.status = 'running'"
            )
        boot = uuid.uuid4().hex[:12]
        for row in rows:
            await self.wake(row["tenant"], row["run_id"], f"restart-{boot}")
        return len(rows)

    async def wake_answered(self) -> int:
        """Wake every turn still waiting on a plan its user answered, or on a resume its
        session already had: the wake that followed the answer's commit was lost (a crash
        in between). The wake's message id is the answer's own, so a wake that was not lost
        is not delivered twice. Returns how many were woken."""
        async with self._store.acquire() as conn:
            rows = await conn.fetch(
                "SELECT r.run_id, r.tenant, p.plan_id AS why FROM planner.runs r "
                "JOIN planner.plans p ON p.run_id = r.run_id AND p.plan_id = r.pending_id "
                "WHERE r.status = 'awaiting_human' AND p.state <> 'proposed' "
                "UNION ALL "
                "SELECT r.run_id, r.tenant, 'unheld' AS why FROM planner.runs r "
                "JOIN planner.session_turns t ON t.run_id = r.run_id "
                "JOIN planner.sessions s ON s.session_id = t.session_id "
                "WHERE r.status = 'awaiting_human' AND r.pending_id = $1::text || r.run_id "
                "AND s.state <> 'paused'",
                PAUSE_PREFIX,
            )
        for row in rows:
            why = row["why"]
            await self.wake(row["tenant"], row["run_id"], why if why == "unheld" else f"plan-{why}")
        return len(rows)

    async def sweep(self, *, interval_s: float = 1.0) -> None:
        """Wake the turns in flight a stopped planner left, then forever: start accepted
        turns nobody started, publish events nobody published."""
        try:
            woken = await self.wake_in_flight()
            if woken:
                log.info("woke %d session turns in flight", woken)
        except Exception as exc:
            log.warning("session turns in flight not woken: %r", exc)
        while True:
            try:
                async with self._store.acquire() as conn:
                    turns = await self._store.unstarted(conn)
                    sessions = await self._store.unpublished(conn)
                    owners = {t.run_id: await self._store.get(conn, t.session_id) for t in turns}
                for turn in turns:
                    owner = owners[turn.run_id]
                    if owner is not None:
                        await self.start(owner, turn)
                for session in sessions:
                    await self.flush(session.session_id)
                await self.wake_answered()
            except Exception as exc:
                log.warning("session sweep: %r", exc)
            await anyio.sleep(interval_s)


def _selected(sid: str, turn: int, step: int, capability: str, n: int) -> CapabilitySelected:
    return CapabilitySelected(session_id=sid, n=n, turn=turn, step=step, capability=capability)


def _observed(sid: str, turn: int, step: int, summary: str, n: int) -> Observed:
    return Observed(session_id=sid, n=n, turn=turn, step=step, summary=summary)
