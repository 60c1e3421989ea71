"""Chat sessions through the SDK (`writ_client.Session`, over HTTP): turns per second across
32 concurrent sessions, and after each message the time to the session's first streamed event
and to its first model text delta (p50 / p99)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import anyio
import httpx
import nats

from bench.measure import closed_loop, percentile
from bench.report import cpu_ms_per_op, sample_dict
from bench.runs import PRINCIPAL, TENANT, TIMEOUT_S
from schemas.sessions import SessionClosed, TextDelta, TurnEnded
from writ.demo import DEMO_INPUT
from writ_client import Client, Issuer, Session, WritError

if TYPE_CHECKING:
    from bench.phases import Bench

__all__ = ["SESSIONS", "ChatPath", "chat_path"]

SESSIONS = 32


class ChatPath:
    """A pool of open sessions; one operation is one turn on an idle one, message to end."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._idle: list[Session] = []
        self._free = anyio.Semaphore(0)
        self.first_event_s: list[float] = []
        self.first_delta_s: list[float] = []
        self.statuses: dict[str, int] = {}

    async def open(self, count: int) -> None:
        """Open `count` sessions with the demo agent."""
        for _ in range(count):
            self._idle.append(await self._client.open_session(
                "crm-assistant", request_id=f"bench-chat-{uuid.uuid4().hex}"))
            self._free.release()

    async def one(self) -> bool:
        """One turn: send the demo message, read the stream to the turn's end."""
        await self._free.acquire()
        session = self._idle.pop()
        try:
            return await self._turn(session)
        finally:
            self._idle.append(session)
            self._free.release()

    async def _turn(self, session: Session) -> bool:
        began = time.monotonic()
        first_event = first_delta = None
        status = "timeout"
        try:
            with anyio.move_on_after(TIMEOUT_S):
                async for event in session.turn(DEMO_INPUT):
                    now = time.monotonic() - began
                    first_event = now if first_event is None else first_event
                    if isinstance(event, TextDelta) and first_delta is None:
                        first_delta = now
                    if isinstance(event, TurnEnded):
                        status = event.status
                    elif isinstance(event, SessionClosed):
                        status = "closed"
        except (WritError, httpx.HTTPError) as exc:
            status = getattr(exc, "code", type(exc).__name__)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status != "succeeded":
            return False
        if first_event is not None:
            self.first_event_s.append(first_event)
        if first_delta is not None:
            self.first_delta_s.append(first_delta)
        return True


def _ms(values: list[float], q: float) -> float | None:
    return round(percentile(values, q) * 1000, 1) if values else None


async def chat_path(bench: Bench) -> None:
    """A closed loop of turns over `SESSIONS` sessions, each with its own event stream."""
    from bench.phases import BenchError, _s

    r, data, stack = bench.report, bench.report.data, bench.stack
    r.section(f"Chat sessions: message -> turn -> TurnEnded, {SESSIONS} sessions (SDK, HTTP)")
    bench.alive()
    issuer = Issuer.from_file(stack.secrets / f"host-{TENANT}.pem", tenant=TENANT,
                              issuer=stack.issuer(TENANT))
    # Each turn holds one SSE connection and makes one write: two per session at most.
    http = httpx.AsyncClient(base_url=stack.api_url, timeout=TIMEOUT_S,
                             limits=httpx.Limits(max_connections=SESSIONS * 2 + 4))
    nc = await nats.connect(stack.nats_url, name="bench-chat")
    async with Client(stack.api_url, issuer, PRINCIPAL, http=http) as client:
        try:
            path = ChatPath(client)
            await path.open(SESSIONS)
            await bench.settle(nc, "chat_path")
            watch = bench.window()
            best = await closed_loop(path.one, concurrency=SESSIONS, warmup_s=_s(3),
                                     duration_s=_s(15), watcher=watch)
            if best.completed == 0:
                raise BenchError(f"no chat turn succeeded: {path.statuses}")
            data["chat_turns_per_s"] = round(best.rate, 1)
            data["chat_path"] = {
                **sample_dict(best), "sessions": SESSIONS, "statuses": path.statuses,
                "first_event_p50_ms": _ms(path.first_event_s, 50),
                "first_event_p99_ms": _ms(path.first_event_s, 99),
                "first_delta_p50_ms": _ms(path.first_delta_s, 50),
                "first_delta_p99_ms": _ms(path.first_delta_s, 99),
                "turns_with_deltas": len(path.first_delta_s), "usage": watch.report(),
                "cpu_ms_per_turn": cpu_ms_per_op(watch.report(), best.rate)}
            r.sample(f"closed loop, {SESSIONS} sessions", best, "turn/s")
            chat = data["chat_path"]
            r.line("first streamed event after a message",
                   f"p50 {chat['first_event_p50_ms']} ms   p99 {chat['first_event_p99_ms']} ms")
            r.line("first model text delta after a message",
                   f"p50 {chat['first_delta_p50_ms']} ms   p99 {chat['first_delta_p99_ms']} ms"
                   f"   ({len(path.first_delta_s)} of {best.completed} turns streamed text)")
            r.usage(watch.report(), per=(best.completed, "turn"))
        finally:
            await nc.close()
