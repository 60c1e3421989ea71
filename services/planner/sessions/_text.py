"""A turn's model call as the session's client sees it: the text it streams, batched on the
session's subject as it comes (progress, not stored: the decision is), reset when a call
replaces an earlier one or a close abandons it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from nats.js import JetStreamContext

from libs.bus import publish
from schemas.sessions import TextDelta, TextReset, chat_subject
from services.planner.deltas import AttemptReset, DeltaBatcher, TextBatch
from services.planner.sessions._inflight import InFlightCalls, ModelCallAbandoned, cancelled_before
from services.planner.sessions._store import SessionStore
from services.planner.sessions.logic import is_turn_run, turn_of
from services.planner.store import RunRow

__all__ = ["TurnText"]

log = logging.getLogger("writ.planner.sessions")


class TurnText:
    """Streams a turn's model calls' text; counts the calls begun for each step."""

    def __init__(
        self, *, js: JetStreamContext, store: SessionStore, in_flight: InFlightCalls
    ) -> None:
        self._js, self._store, self._in_flight = js, store, in_flight

    @asynccontextmanager
    async def sink(self, run: RunRow, seq: int) -> AsyncIterator[DeltaBatcher | None]:
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
        with self._in_flight.watch(run.run_id) as scope:
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
