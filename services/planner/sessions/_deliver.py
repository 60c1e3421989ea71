"""What follows a session's commits: its new events published on its subject, an accepted
turn's run registered with governance and handed to retrieval, a turn's run woken, the
admitted progress heard live, and the sweep that does all of it again for anything a crash
left between a commit and what follows it."""

from __future__ import annotations

import logging
import uuid
from typing import Final

import anyio
import msgspec
from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.bus import publish
from libs.runstart import start_run
from schemas import subjects
from schemas.admission import CommandAdmitted
from schemas.governance import RegisterTurn
from schemas.planner import BranchChanged
from schemas.sessions import DecisionTaken, StepAdmitted, chat_subject
from services.planner.sessions._listen import listen
from services.planner.sessions._plans import PAUSE_PREFIX
from services.planner.sessions._store import SessionRow, SessionStore, TurnRow
from services.planner.sessions.logic import is_turn_run, turn_of

__all__ = ["SessionDelivery"]

log = logging.getLogger("writ.planner.sessions")
# Whoever of the planner's replicas takes an admitted event: one of them records it.
_ADMITTED_QUEUE: Final = "planner-sessions"


class SessionDelivery:
    """Publishes, starts and wakes what a session's transactions committed."""

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
        if turn.expired is not None:
            # Its input was erased before it could start (retention, an erasure): it never
            # will; it ends failed rather than starting on anything standing in for it.
            log.warning("turn %s not started: payload expired (%s)", turn.run_id, turn.expired)
            async with self._store.acquire() as conn:
                await self._store.mark_started(conn, turn.run_id)
                await self._store.end_turn(conn, turn.run_id, "failed")
            return
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
