"""`Session`: one chat session (docs/design.md §10), over HTTP (`Client`: `/api/v1/sessions`, the
events as Server-Sent Events) or NATS (`NatsClient`: `writ.api.<tenant>.session`, the events
read in batches after a stream sequence): the same methods, the same types. `SyncSession` is
the same object for blocking code (`SyncClient`): each method runs the async one on the
client's event loop thread."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final, Protocol, TypeVar

import anyio
import httpx
import msgspec
from anyio.from_thread import BlockingPortal

from writ_client._wire.sessions import (
    AnySessionEvent,
    PlanAnswered,
    SessionAccepted,
    SessionClosed,
    SessionOpKind,
    SessionView,
    TurnEnded,
)
from writ_client.errors import InvalidResponse, Unavailable

__all__ = [
    "Session",
    "SessionTransport",
    "StreamLost",
    "SyncSession",
    "decode_event",
    "iterate",
    "read_sse",
]

T = TypeVar("T")
_EVENT: Final = msgspec.json.Decoder(AnySessionEvent)


class SessionTransport(Protocol):
    """What a `Session` needs of its client (`Client` or `NatsClient`)."""

    async def _session_write(
        self, op: SessionOpKind, session_id: str, request_id: str | None, **fields: Any
    ) -> SessionAccepted: ...

    async def _session_view(self, session_id: str) -> SessionView: ...

    def _session_events(
        self, session_id: str, after: int
    ) -> AsyncIterator[tuple[int, AnySessionEvent | None]]: ...

    async def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered: ...

    async def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered: ...


def decode_event(data: bytes) -> AnySessionEvent | None:
    """A session event, or None for a type (or field value) this SDK does not know."""
    try:
        return _EVENT.decode(data)
    except msgspec.ValidationError:
        return None


# One SSE event's data is one session event; anything longer is not Writ's.
MAX_EVENT_BYTES: Final = 256 * 1024


class Session:
    """A conversation of the client's principal with one agent.

    Writes carry an Idempotency-Key (a fresh one unless given) and are retried under it, as
    every `Client` write is. `events()` reads the session's ordered stream and remembers the
    last event it saw (`last_event_id`, the stream sequence), so reading again, or a dropped
    connection, resumes right after it: no gap, no duplicate.
    """

    def __init__(
        self, client: SessionTransport, session_id: str, *, last_event_id: int = 0
    ) -> None:
        self._client, self.session_id = client, session_id
        self.last_event_id = last_event_id

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, last_event_id={self.last_event_id})"

    async def send(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """Send the next message: it starts a turn (`WritError` `SESSION_BUSY` while one is
        in flight, and nothing is applied)."""
        return await self._client._session_write("message", self.session_id, request_id, text=text)

    async def history(self) -> SessionView:
        """Where the session stands: state, what it waits for, messages, plans, forks."""
        return await self._client._session_view(self.session_id)

    async def pause(self, *, request_id: str | None = None) -> SessionAccepted:
        """Stop the turn before its next model decision (durable)."""
        return await self._client._session_write("pause", self.session_id, request_id)

    async def resume(self, *, request_id: str | None = None) -> SessionAccepted:
        """Go on from the recorded step."""
        return await self._client._session_write("resume", self.session_id, request_id)

    async def inject(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """A message the model sees at its next decision, marked as injected."""
        return await self._client._session_write("inject", self.session_id, request_id, text=text)

    async def close(self, *, request_id: str | None = None) -> SessionAccepted:
        """Close the session (terminal; its history stays readable)."""
        return await self._client._session_write("close", self.session_id, request_id)

    async def fork(
        self, turn: int, step: int | None = None, *, request_id: str | None = None
    ) -> Session:
        """A new session whose history is this one's up to `turn` (or its `step`)."""
        accepted = await self._client._session_write(
            "fork", self.session_id, request_id, turn=turn, step=step
        )
        return Session(self._client, accepted.session_id)

    async def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered:
        """Consent to a proposed plan, by its id (each step is still decided when made)."""
        return await self._client.approve_plan(plan_id, reason=reason, request_id=request_id)

    async def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered:
        """Reject a proposed plan; `reason` is the next turn's context."""
        return await self._client.reject_plan(plan_id, reason, request_id=request_id)

    async def events(self, *, after: int | None = None) -> AsyncGenerator[AnySessionEvent, None]:
        """The session's events in order, from right after `after` (a stream sequence; by
        default the last event this object saw, 0 for the beginning). It does not end by
        itself: stop iterating when done (`turn` stops at the turn's end). Event types this
        SDK does not know are skipped."""
        if after is not None:
            self.last_event_id = after
        delay = 0.2
        while True:
            try:
                async for seq, event in self._client._session_events(
                    self.session_id, self.last_event_id
                ):
                    delay = 0.2
                    self.last_event_id = seq
                    if event is not None:  # None: a newer server's event type, skipped
                        yield event
            except (httpx.TransportError, StreamLost):
                await anyio.sleep(delay)  # resumes after last_event_id
                delay = min(delay * 2, 5.0)

    async def turn(
        self, text: str, *, request_id: str | None = None
    ) -> AsyncGenerator[AnySessionEvent, None]:
        """Send `text`, then the session's events up to and including that turn's
        `TurnEnded` (or the session's `SessionClosed`)."""
        accepted = await self.send(text, request_id=request_id)
        async for event in self.events():
            yield event
            if isinstance(event, SessionClosed) or (
                isinstance(event, TurnEnded) and event.turn >= accepted.turn
            ):
                return


class SyncSession:
    """`Session`'s methods, blocking: each runs the `Session`'s own on the `SyncClient`'s
    event loop thread (same retries, same keys, same resumption); `events()` and `turn()` are
    plain iterators over the same async ones."""

    def __init__(self, portal: BlockingPortal, session: Session) -> None:
        self._portal, self._session = portal, session

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self._session.session_id

    @property
    def last_event_id(self) -> int:
        """The stream sequence of the last event read (`events()` resumes after it)."""
        return self._session.last_event_id

    def __repr__(self) -> str:
        return f"Sync{self._session!r}"

    def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        return self._portal.call(call)

    def send(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """`Session.send`: send the next message (it starts a turn)."""
        return self._call(lambda: self._session.send(text, request_id=request_id))

    def history(self) -> SessionView:
        """`Session.history`: where the session stands."""
        return self._call(self._session.history)

    def pause(self, *, request_id: str | None = None) -> SessionAccepted:
        """`Session.pause`: stop the turn before its next model decision."""
        return self._call(lambda: self._session.pause(request_id=request_id))

    def resume(self, *, request_id: str | None = None) -> SessionAccepted:
        """`Session.resume`: go on from the recorded step."""
        return self._call(lambda: self._session.resume(request_id=request_id))

    def inject(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """`Session.inject`: a message the model sees at its next decision."""
        return self._call(lambda: self._session.inject(text, request_id=request_id))

    def close(self, *, request_id: str | None = None) -> SessionAccepted:
        """`Session.close`: close the session (terminal)."""
        return self._call(lambda: self._session.close(request_id=request_id))

    def fork(
        self, turn: int, step: int | None = None, *, request_id: str | None = None
    ) -> SyncSession:
        """`Session.fork`: a new session whose history is this one's up to `turn`."""
        forked = self._call(lambda: self._session.fork(turn, step, request_id=request_id))
        return SyncSession(self._portal, forked)

    def approve_plan(
        self, plan_id: str, *, reason: str = "", request_id: str | None = None
    ) -> PlanAnswered:
        """`Session.approve_plan`: consent to a proposed plan."""
        return self._call(
            lambda: self._session.approve_plan(plan_id, reason=reason, request_id=request_id)
        )

    def reject_plan(
        self, plan_id: str, reason: str, *, request_id: str | None = None
    ) -> PlanAnswered:
        """`Session.reject_plan`: reject a proposed plan, saying why."""
        return self._call(lambda: self._session.reject_plan(plan_id, reason, request_id=request_id))

    def events(self, *, after: int | None = None) -> Iterator[AnySessionEvent]:
        """`Session.events`, as an iterator (it does not end by itself: stop iterating)."""
        return self._iterate(self._session.events(after=after))

    def turn(self, text: str, *, request_id: str | None = None) -> Iterator[AnySessionEvent]:
        """`Session.turn`: send `text`, then the events up to that turn's end."""
        return self._iterate(self._session.turn(text, request_id=request_id))

    def _iterate(self, events: AsyncGenerator[AnySessionEvent, None]) -> Iterator[AnySessionEvent]:
        return iterate(self._portal, events)


def iterate(portal: BlockingPortal, items: AsyncIterator[T]) -> Iterator[T]:
    """An async generator as a plain iterator: each item is read on `portal`'s loop, and
    leaving the loop early closes the generator there (its connection with it)."""
    try:
        while True:
            try:
                yield portal.call(items.__anext__)
            except StopAsyncIteration:
                return
    finally:
        if isinstance(items, AsyncGenerator):
            portal.call(items.aclose)


class StreamLost(Unavailable):
    """The transport lost the stream (NATS: no answer); reading resumes after the last id."""


async def read_sse(response: httpx.Response) -> AsyncIterator[tuple[int, bytes]]:
    """Each Server-Sent Event of `response` with an `id`, as (id, data); comments skipped.

    Raises:
        WritError: `INVALID_RESPONSE` for an event past `MAX_EVENT_BYTES` or a bad `id`.
    """
    seq, data, size = None, list[str](), 0
    async for line in response.aiter_lines():
        size += len(line)
        if size > MAX_EVENT_BYTES:
            raise InvalidResponse("INVALID_RESPONSE", "a server-sent event is too large")
        if not line:
            if seq is not None and data:
                yield seq, "\n".join(data).encode()
            seq, data, size = None, [], 0
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith("id:"):
            try:
                seq = int(line[3:].strip())
            except ValueError:
                raise InvalidResponse(
                    "INVALID_RESPONSE", "a server-sent event id is not a number"
                ) from None
