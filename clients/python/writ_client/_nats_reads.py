"""The NATS client's polled reads: a run's steps and a chat session's events, read in turns
on `writ.api.<tenant>.<read>`, and one session operation, retried under its key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal, cast

import anyio

from writ_client._bus import Bus, decode, raise_service_error
from writ_client._session import StreamLost
from writ_client._wire.api import RunEvents
from writ_client._wire.host import RunResult, RunStatus
from writ_client._wire.host_reads import host_read
from writ_client._wire.planner import StepRecorded
from writ_client._wire.sessions import (
    HOST_SESSION,
    AnySessionEvent,
    HostSessionOp,
    SessionOpKind,
    SessionReply,
)
from writ_client.errors import WritError

__all__ = ["run_events", "session_ask", "session_events"]

_FINAL: Final = {"succeeded", "failed", "awaiting_human", "cancelled"}


async def run_events(
    read: Callable[..., Awaitable[RunEvents]], run_id: str, after: int, poll_s: float
) -> AsyncIterator[StepRecorded | RunResult]:
    """The run's committed steps after `after`, then its `RunResult`: read in turns, so a
    lost connection resumes right after the last step seen."""
    while True:
        try:
            batch = await read("events", RunEvents, run_id=run_id, after=after)
        except WritError as exc:
            if exc.code not in ("UNAVAILABLE", "NOT_FOUND"):
                raise
            await anyio.sleep(poll_s)
            continue
        for step in batch.steps:
            after = step.seq
            yield step
        if batch.run.status in _FINAL:
            view = batch.run
            yield RunResult(
                request_id=view.request_id,
                status=cast(RunStatus, view.status),
                run_id=view.run_id,
                error=view.error,
                answer=view.answer,
                actions=view.actions,
                pending_id=view.pending_id,
                proposal=view.proposal,
                version=view.version,
            )
            return
        await anyio.sleep(poll_s)


async def session_events(
    ask: Callable[..., Awaitable[SessionReply]], session_id: str, after: int, *, poll_s: float
) -> AsyncIterator[tuple[int, AnySessionEvent | None]]:
    """The session's events after stream sequence `after`, read in batches."""
    while True:
        try:
            reply = await ask("events", None, session_id=session_id, after=after, retries=0)
        except WritError as exc:
            if exc.code == "UNAVAILABLE":
                raise StreamLost(exc.code, exc.message) from exc
            raise
        assert reply.events is not None
        for item in reply.events.events:
            after = item.seq
            yield item.seq, item.event
        if not reply.events.events:
            await anyio.sleep(poll_s)


async def session_ask(
    bus: Bus,
    token: Callable[[], str],
    tenant: str,
    op: SessionOpKind | Literal["events"],
    key: str | None,
    *,
    retries: int = 3,
    **fields: Any,
) -> SessionReply:
    """One session operation; a write is retried under its key on an outage."""
    delay = 0.2
    for attempt in range(retries + 1):
        ask = HostSessionOp(token=token(), op=op, key=key, **fields)
        try:
            msg = await bus.ask(host_read(tenant, HOST_SESSION), ask)
            raise_service_error(msg.headers)
            return decode(msg.data, SessionReply)
        except WritError as exc:
            if not exc.retryable or attempt == retries:
                raise
        await anyio.sleep(delay)
        delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")
