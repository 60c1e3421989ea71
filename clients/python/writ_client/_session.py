"""`Session`: one chat session over Writ's HTTP API (`/api/v1/sessions`, DESIGN.md §10)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

import anyio
import httpx
import msgspec

from schemas.sessions import (
    AnySessionEvent,
    PlanAnswered,
    SessionAccepted,
    SessionClosed,
    SessionView,
    TurnEnded,
)
from writ_client.errors import WritError

if TYPE_CHECKING:
    from writ_client._http import Client

__all__ = ["Session", "read_sse"]

_EVENT: Final = msgspec.json.Decoder(AnySessionEvent)
# One SSE event's data is one session event; anything longer is not Writ's.
MAX_EVENT_BYTES: Final = 256 * 1024


class Session:
    """A conversation of the client's principal with one agent.

    Writes carry an Idempotency-Key (a fresh one unless given) and are retried under it, as
    every `Client` write is. `events()` reads the session's ordered stream and remembers the
    last event it saw (`last_event_id`, the stream sequence), so reading again, or a dropped
    connection, resumes right after it: no gap, no duplicate.
    """

    def __init__(self, client: Client, session_id: str, *, last_event_id: int = 0) -> None:
        self._client, self.session_id = client, session_id
        self.last_event_id = last_event_id

    def __repr__(self) -> str:
        return f"Session({self.session_id!r}, last_event_id={self.last_event_id})"

    async def send(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """Send the next message: it starts a turn (`WritError` `SESSION_BUSY` while one is
        in flight, and nothing is applied)."""
        return await self._write("messages", {"text": text}, request_id, "msg")

    async def history(self) -> SessionView:
        """Where the session stands: state, what it waits for, messages, plans, forks."""
        return await self._client._get(f"/sessions/{self.session_id}", SessionView)

    async def pause(self, *, request_id: str | None = None) -> SessionAccepted:
        """Stop the turn before its next model decision (durable)."""
        return await self._write("pause", None, request_id, "pause")

    async def resume(self, *, request_id: str | None = None) -> SessionAccepted:
        """Go on from the recorded step."""
        return await self._write("resume", None, request_id, "resume")

    async def inject(self, text: str, *, request_id: str | None = None) -> SessionAccepted:
        """A message the model sees at its next decision, marked as injected."""
        return await self._write("inject", {"text": text}, request_id, "inject")

    async def close(self, *, request_id: str | None = None) -> SessionAccepted:
        """Close the session (terminal; its history stays readable)."""
        return await self._write("close", None, request_id, "close")

    async def fork(self, turn: int, step: int | None = None, *,
                   request_id: str | None = None) -> Session:
        """A new session whose history is this one's up to `turn` (or its `step`)."""
        accepted = await self._write("fork", {"turn": turn, "step": step}, request_id, "fork")
        return Session(self._client, accepted.session_id)

    async def approve_plan(self, plan_id: str, *, reason: str = "",
                           request_id: str | None = None) -> PlanAnswered:
        """Consent to a proposed plan, by its id (each step is still decided when made)."""
        return await self._client.approve_plan(plan_id, reason=reason, request_id=request_id)

    async def reject_plan(self, plan_id: str, reason: str, *,
                          request_id: str | None = None) -> PlanAnswered:
        """Reject a proposed plan; `reason` is the next turn's context."""
        return await self._client.reject_plan(plan_id, reason, request_id=request_id)

    async def events(self, *, after: int | None = None) -> AsyncIterator[AnySessionEvent]:
        """The session's events in order, from right after `after` (a stream sequence; by
        default the last event this object saw, 0 for the beginning). It does not end by
        itself: stop iterating when done (`turn` stops at the turn's end). Event types this
        SDK does not know are skipped."""
        if after is not None:
            self.last_event_id = after
        delay = 0.2
        while True:
            try:
                async for seq, data in self._client._sse(
                        f"/sessions/{self.session_id}/events", self.last_event_id):
                    delay = 0.2
                    self.last_event_id = seq
                    try:
                        event = _EVENT.decode(data)
                    except msgspec.ValidationError:
                        continue  # a newer server's event type (or field value): skip it
                    yield event
            except httpx.TransportError:
                await anyio.sleep(delay)  # resumes after last_event_id
                delay = min(delay * 2, 5.0)

    async def turn(self, text: str, *, request_id: str | None = None
                   ) -> AsyncIterator[AnySessionEvent]:
        """Send `text`, then the session's events up to and including that turn's
        `TurnEnded` (or the session's `SessionClosed`)."""
        accepted = await self.send(text, request_id=request_id)
        async for event in self.events():
            yield event
            if isinstance(event, SessionClosed) or (
                    isinstance(event, TurnEnded) and event.turn >= accepted.turn):
                return

    async def _write(self, what: str, body: object, request_id: str | None,
                     prefix: str) -> SessionAccepted:
        return await self._client._write(f"/sessions/{self.session_id}/{what}",
                                         SessionAccepted, body, request_id, prefix)


async def read_sse(response: httpx.Response) -> AsyncIterator[tuple[int, bytes]]:
    """Each Server-Sent Event of `response` with an `id`, as (id, data); comments skipped.

    Raises:
        WritError: `INVALID_RESPONSE` for an event past `MAX_EVENT_BYTES` or a bad `id`.
    """
    seq, data, size = None, list[str](), 0
    async for line in response.aiter_lines():
        size += len(line)
        if size > MAX_EVENT_BYTES:
            raise WritError("INVALID_RESPONSE", "a server-sent event is too large")
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
                raise WritError("INVALID_RESPONSE", "a server-sent event id is not a "
                                "number") from None
