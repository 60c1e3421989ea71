"""`writ.int.planner.session`: the operations on a session ingress hands on verified (tenant
and principal from the token), each one transaction under the session's row lock that moves
the state through `logic.transition` and records its numbered event (and journal row).

A message is accepted only by the conditional update from `active` (`SessionStore.move`), so
of concurrent sends exactly one is: the others find `processing` and get `SESSION_BUSY`, with
nothing applied. A message re-sent under its Idempotency-Key gets its first acceptance again.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import msgspec
from nats.micro.request import Request

from schemas.control import RunCancelRequested
from schemas.sessions import (
    PlanAnswered,
    SessionAccepted,
    SessionClosed,
    SessionInjected,
    SessionList,
    SessionMessage,
    SessionOp,
    SessionOpened,
    SessionPaused,
    SessionReply,
    SessionResumed,
    SessionSummary,
    SessionView,
    TurnStarted,
    UserMessage,
    WaitingFor,
)
from services.planner.agents import AgentRegistry
from services.planner.cancel import record_cancel
from services.planner.memory import HISTORY_TOKENS
from services.planner.sessions._fork import ForkRefused, SessionForks
from services.planner.sessions._plans import PLAN_WAIT, PlanAnsweredAlready, SessionClosedAlready
from services.planner.sessions._store import SessionRow, entry_of
from services.planner.sessions._turns import SessionTurns
from services.planner.sessions.logic import (
    SessionRefused,
    conversation,
    fork_id_for,
    session_id_for,
    transition,
    turn_run_id,
)

__all__ = ["SessionOpsEndpoint"]

log = logging.getLogger("writ.planner.sessions")
_DECODER: Final = msgspec.json.Decoder(SessionOp)
_ENCODER: Final = msgspec.json.Encoder()


class _Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _links(session_id: str) -> dict[str, str]:
    base = f"/api/v1/sessions/{session_id}"
    return {"self": base, "events": f"{base}/events", "messages": f"{base}/messages"}


def _accepted(session: SessionRow, *, turn: int = 0, run_id: str | None = None) -> SessionAccepted:
    return SessionAccepted(
        session_id=session.session_id,
        state=session.state,  # type: ignore[arg-type]
        turn=turn or session.turn,
        run_id=run_id,
        links=_links(session.session_id),
    )


class SessionOpsEndpoint:
    """Answers each `SessionOp` with a `SessionReply`."""

    def __init__(self, *, turns: SessionTurns, agents: AgentRegistry) -> None:
        self._turns, self._store, self._agents = turns, turns.store, agents
        self._forks = SessionForks(store=turns.store, memory_tokens=self._memory_tokens)

    async def __call__(self, request: Request) -> None:
        """Answer one operation."""
        try:
            op = _DECODER.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid SessionOp: {exc}"[:500])
            return
        try:
            reply = await self.handle(op)
        except _Refused as exc:
            reply = SessionReply(ok=False, code=exc.code, message=exc.message[:512])
        except SessionRefused as exc:
            reply = SessionReply(ok=False, code=exc.code, message=str(exc)[:512])
        await request.respond(_ENCODER.encode(reply))

    async def handle(self, op: SessionOp) -> SessionReply:
        """One operation, answered once its transaction committed (and what follows began)."""
        if op.op == "open":
            return await self._open(op)
        if op.op == "get":
            async with self._store.acquire() as conn:
                return SessionReply(ok=True, view=await self.view(conn, op))
        if op.op == "fork":
            return await self._fork(op)
        if op.op == "list":
            async with self._store.acquire() as conn:
                return SessionReply(ok=True, sessions=await self._list(conn, op))
        if op.op in ("approve_plan", "reject_plan"):
            return await self._plan(op)
        return await self._change(op)

    async def _mine(self, conn: Any, op: SessionOp, *, lock: bool) -> SessionRow:
        if not op.session_id:
            raise _Refused("INVALID_REQUEST", "this operation names a session")
        session = await (
            self._store.lock(conn, op.session_id) if lock else self._store.get(conn, op.session_id)
        )
        # Another tenant's or principal's session is not told apart from none.
        if session is None or (session.tenant, session.principal) != (op.tenant, op.principal):
            raise _Refused("NOT_FOUND", "no such session")
        return session

    async def _open(self, op: SessionOp) -> SessionReply:
        if op.agent is None or not op.key:
            raise _Refused("INVALID_REQUEST", "opening a session names an agent and a key")
        agent_name, key = op.agent, op.key
        agent = self._agents.get(agent_name)
        if agent is None:
            raise _Refused("UNKNOWN_AGENT", f"no manifest declares agent {op.agent!r}")
        # The agent's manifest may ask for plan-mode; a session cannot turn it off.
        op = msgspec.structs.replace(op, plan_mode=op.plan_mode or agent.manifest.plan_mode)
        session_id = session_id_for(op.tenant, key)
        async with self._store.acquire() as conn, conn.transaction():
            if await self._store.create(
                conn,
                session_id=session_id,
                tenant=op.tenant,
                principal=op.principal,
                agent=agent_name,
                plan_mode=op.plan_mode,
                open_key=key,
            ):
                session = await self._store.lock(conn, session_id)
                assert session is not None
                await self._store.add_event(
                    conn,
                    session,
                    "opened",
                    lambda n: SessionOpened(
                        session_id=session_id,
                        n=n,
                        agent=op.agent or "",
                        principal=op.principal,
                        plan_mode=op.plan_mode,
                    ),
                )
            session = await self._mine(
                conn, msgspec.structs.replace(op, session_id=session_id), lock=False
            )
        await self._turns.flush(session_id)
        return SessionReply(ok=True, accepted=_accepted(session))

    async def _change(self, op: SessionOp) -> SessionReply:
        wake: tuple[str, str] | None = None
        started = None
        async with self._store.acquire() as conn:
            async with conn.transaction():
                session = await self._mine(conn, op, lock=True)
                if op.op == "message":
                    reply, started = await self._message(conn, session, op)
                    if started is None:
                        return reply
                else:
                    session, wake = await self._move(conn, session, op)
                    reply = SessionReply(ok=True, accepted=_accepted(session))
        if started is not None:
            try:
                await self._turns.start(session, started)
            except Exception as exc:  # accepted and recorded: the sweep starts it
                log.warning("turn %s not started yet: %r", started.run_id, exc)
        if wake is not None:
            if op.op == "close":  # a model call in flight for the turn is abandoned now
                await self._turns.in_flight.tell(session.tenant, wake[0])
            await self._turns.wake(session.tenant, *wake)
        await self._turns.flush(session.session_id)
        return reply

    async def _message(
        self, conn: Any, session: SessionRow, op: SessionOp
    ) -> tuple[SessionReply, Any]:
        if not op.key or op.text is None:
            raise _Refused("INVALID_REQUEST", "a message has a text and a key")
        first = await self._store.turn_by_key(conn, session.session_id, op.key)
        if first is not None:  # the same message again: its first acceptance
            return SessionReply(
                ok=True,
                accepted=SessionAccepted(
                    session_id=session.session_id,
                    state="processing",
                    turn=first.turn,
                    run_id=first.run_id,
                    links=_links(session.session_id),
                ),
            ), None
        state = transition(session.state, "message")
        turn = session.turn + 1
        run_id = turn_run_id(session.session_id, turn)
        history = await self._store.history(conn, session.session_id)
        run_input = conversation(history, op.text, budget=self._memory_tokens(session))
        # Messages injected between turns are in the history this turn's input carries.
        await self._store.take_injections(conn, session.session_id, run_id, -1)
        session = await self._store.move(conn, session, state, turn=turn, turn_open=True)
        await self._store.add_turn(
            conn, session.session_id, turn, run_id, op.key, run_input, tenant=session.tenant
        )
        text = op.text
        session, _ = await self._store.add_event(
            conn,
            session,
            f"message:{op.key}",
            lambda n: UserMessage(session_id=session.session_id, n=n, turn=turn, text=text),
        )
        session, _ = await self._store.add_event(
            conn,
            session,
            f"turn:{turn}",
            lambda n: TurnStarted(session_id=session.session_id, n=n, turn=turn, run_id=run_id),
        )
        turn_row = await self._store.turn_by_key(conn, session.session_id, op.key)
        return SessionReply(
            ok=True, accepted=_accepted(session, turn=turn, run_id=run_id)
        ), turn_row

    async def _move(
        self, conn: Any, session: SessionRow, op: SessionOp
    ) -> tuple[SessionRow, tuple[str, str] | None]:
        """pause | resume | inject | close: the table's next state and its event."""
        source = f"{op.op}:{op.key or ''}:{session.last_n}"
        state = transition(session.state, op.op, turn_open=session.turn_open)
        wake = None
        run_id = turn_run_id(session.session_id, session.turn) if session.turn else None
        if op.op == "inject":
            if op.text is None:
                raise _Refused("INVALID_REQUEST", "an injected message has a text")
            text = op.text
            turn = session.turn if session.turn_open else session.turn + 1
            session, n = await self._store.add_event(
                conn,
                session,
                source,
                lambda n: SessionInjected(session_id=session.session_id, n=n, turn=turn, text=text),
            )
            if n is not None:
                await self._store.inject(conn, session.session_id, n, text)
            return session, None
        if state != session.state:
            session = await self._store.move(conn, session, state)
        if op.op == "pause":
            session, _ = await self._store.add_event(
                conn,
                session,
                source,
                lambda n: SessionPaused(session_id=session.session_id, n=n, reason=op.reason),
            )
        elif op.op == "resume":
            session, n = await self._store.add_event(
                conn, session, source, lambda n: SessionResumed(session_id=session.session_id, n=n)
            )
            if session.turn_open and run_id is not None:
                wake = (run_id, f"resume-{n}")
        elif op.op == "close":
            session, n = await self._store.add_event(
                conn,
                session,
                source,
                lambda n: SessionClosed(session_id=session.session_id, n=n, reason=op.reason),
            )
            if session.turn_open and run_id is not None:
                # The turn in flight is cancelled by the runs' own machinery: nothing more is
                # scheduled, a command already admitted runs to its recorded outcome.
                await record_cancel(
                    conn,
                    RunCancelRequested(
                        tenant=session.tenant,
                        run_id=run_id,
                        principal=op.principal,
                        request_id=op.key or f"close-{session.session_id}",
                    ),
                )
                wake = (run_id, f"close-{n}")
        return session, wake

    async def _plan(self, op: SessionOp) -> SessionReply:
        if not op.plan_id:
            raise _Refused("INVALID_REQUEST", "a plan's answer names the plan")
        async with self._store.acquire() as conn:
            async with conn.transaction():
                try:
                    session, plan, run_id = await self._turns.plans.answer(
                        conn,
                        self._store,
                        tenant=op.tenant,
                        principal=op.principal,
                        plan_id=op.plan_id,
                        approve=op.op == "approve_plan",
                        reason=op.reason,
                        approver=op.approver,
                    )
                except LookupError as exc:
                    raise _Refused("NOT_FOUND", str(exc)) from exc
                except PlanAnsweredAlready as exc:
                    raise _Refused("PLAN_ANSWERED", str(exc)) from exc
                except SessionClosedAlready as exc:
                    raise _Refused("SESSION_CLOSED", str(exc)) from exc
        await self._turns.wake(session.tenant, run_id, f"plan-{plan.plan_id}")
        await self._turns.flush(session.session_id)
        return SessionReply(
            ok=True,
            plan=PlanAnswered(
                plan_id=plan.plan_id, session_id=session.session_id, state=plan.state
            ),
        )

    async def _fork(self, op: SessionOp) -> SessionReply:
        if not op.key or op.turn is None:
            raise _Refused("INVALID_REQUEST", "a fork names a turn and has a key")
        async with self._store.acquire() as conn, conn.transaction():
            parent = await self._mine(conn, op, lock=True)
            transition(parent.state, "fork")
            if op.turn > parent.turn:
                raise _Refused("INVALID_REQUEST", f"the session has {parent.turn} turns")
            fork_id = fork_id_for(parent.session_id, op.key)
            try:
                started = await self._forks.make(conn, parent, fork_id, op.turn, op.step)
            except ForkRefused as exc:
                raise _Refused("INVALID_REQUEST", str(exc)) from None
            fork_row = await self._store.get(conn, fork_id)
            assert fork_row is not None
        if started is not None:
            try:
                await self._turns.start(fork_row, started)
            except Exception as exc:  # accepted and recorded: the sweep starts it
                log.warning("turn %s not started yet: %r", started.run_id, exc)
        await self._turns.flush(parent.session_id)
        await self._turns.flush(fork_id)
        if started is not None:
            return SessionReply(
                ok=True, accepted=_accepted(fork_row, turn=started.turn, run_id=started.run_id)
            )
        return SessionReply(ok=True, accepted=_accepted(fork_row))

    def _memory_tokens(self, session: SessionRow) -> int:
        """The memory budget the session's agent declares (the default if it is gone)."""
        agent = self._agents.get(session.agent)
        return agent.manifest.memory_tokens if agent is not None else HISTORY_TOKENS

    async def _list(self, conn: Any, op: SessionOp) -> SessionList:
        """The principal's own sessions (not the child sessions of agent calls), newest
        first, a page after `op.cursor`."""
        rows = await conn.fetch(
            "SELECT session_id, agent, state, plan_mode, turn, parent_session_id "
            "FROM planner.sessions s WHERE tenant = $1 AND principal = $2 "
            "AND branch_run_id IS NULL AND ($3::text IS NULL OR (created_at, session_id) < "
            "(SELECT created_at, session_id FROM planner.sessions WHERE session_id = $3 "
            "AND tenant = $1 AND principal = $2)) "
            "ORDER BY created_at DESC, session_id DESC LIMIT $4",
            op.tenant,
            op.principal,
            op.cursor,
            op.limit + 1,
        )
        page = [SessionSummary(**dict(r)) for r in rows[: op.limit]]
        return SessionList(
            sessions=page, next=page[-1].session_id if len(rows) > op.limit else None
        )

    async def view(self, conn: Any, op: SessionOp) -> SessionView:
        """Where the session stands, and its history."""
        session = await self._mine(conn, op, lock=False)
        messages = [
            SessionMessage(
                n=n,
                turn=e.turn,
                role=e.role,
                text=e.text,
            )
            for n, e in await self._history_numbered(conn, session.session_id)
        ]
        waiting = await self._waiting(conn, session)
        return SessionView(
            session_id=session.session_id,
            agent=session.agent,
            principal=session.principal,
            state=session.state,  # type: ignore[arg-type]
            plan_mode=session.plan_mode,
            turn=session.turn,
            run_id=session.branch_run_id
            or (turn_run_id(session.session_id, session.turn) if session.turn else None),
            waiting_for=waiting,
            parent_session_id=session.parent_session_id,
            fork_turn=session.fork_turn,
            fork_step=session.fork_step,
            children=await self._store.children(conn, session.session_id),
            messages=messages,
            plans=await self._turns.plans.of_session(conn, session.session_id),
            last_event=session.last_n,
        )

    async def _history_numbered(self, conn: Any, session_id: str) -> list[tuple[int, Any]]:
        out = []
        for event in await self._store.events(conn, session_id):
            entry = entry_of(event)
            if entry is not None:
                out.append((event.n, entry))
        return out

    async def _waiting(self, conn: Any, session: SessionRow) -> WaitingFor | None:
        if session.state == "paused":
            return WaitingFor(kind="resume", message="paused: resume to go on")
        if session.state != "processing" or not session.turn:
            return None
        run = await conn.fetchrow(
            "SELECT status, pending_id, error_message FROM planner.runs WHERE run_id = $1",
            turn_run_id(session.session_id, session.turn),
        )
        if (
            run is not None
            and run["status"] == "awaiting_human"
            and (run["pending_id"] or "").startswith("plan-")
        ):
            return WaitingFor(kind="plan", plan_id=run["pending_id"], message=PLAN_WAIT)
        if run is not None and run["status"] == "awaiting_human":
            return WaitingFor(
                kind="person",
                pending_id=run["pending_id"],
                message=(run["error_message"] or "")[:512],
            )
        return WaitingFor(kind="model", message="the turn is in flight")
