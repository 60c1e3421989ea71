"""Chat sessions over the HTTP door: 32 sessions, each turn a message and its events read over
SSE until `TurnEnded`. Keys: time from `POST /sessions/{id}/messages` to the first streamed
event of the turn and to its first text delta (p50 / p99), and turns per second across the 32
sessions (each session takes one turn at a time: a second message would be SESSION_BUSY)."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from bench.measure import closed_loop, percentile
from bench.report import sample_dict
from bench.runs import PRINCIPAL, TENANT, TIMEOUT_S

if TYPE_CHECKING:
    from bench.phases import Bench

__all__ = ["session_path"]

SESSIONS = 32
AGENT = "chat-assistant"


class _Sessions:
    """A pool of open sessions; each turn takes one, sends, reads its SSE to the turn's end."""

    def __init__(self, client: httpx.AsyncClient, token: str) -> None:
        self._client = client
        self._headers = {"Authorization": f"Bearer {token}"}
        self._free: list[tuple[str, int]] = []  # (session id, last stream sequence seen)
        self._ready = anyio.Semaphore(0)
        self.first_event_ms: list[float] = []
        self.first_delta_ms: list[float] = []
        self.statuses: dict[str, int] = {}

    async def open(self, count: int) -> None:
        for _ in range(count):
            opened = await self._client.post(
                "/sessions",
                json={"agent": AGENT},
                headers={**self._headers, "Idempotency-Key": f"bench-s-{uuid.uuid4().hex}"},
            )
            opened.raise_for_status()
            self._free.append((opened.json()["session_id"], 0))
            self._ready.release()

    async def one(self) -> bool:
        """One turn of a free session."""
        await self._ready.acquire()
        sid, last = self._free.pop()
        seen = last
        try:
            ok, seen = await self._turn(sid, last)
            return ok
        except httpx.HTTPError as exc:
            self._count(type(exc).__name__)
            return False
        finally:
            self._free.append((sid, seen))
            self._ready.release()

    async def _turn(self, sid: str, last: int) -> tuple[bool, int]:
        headers = {**self._headers, "Last-Event-ID": str(last)} if last else self._headers
        ok, seen = False, last
        with anyio.move_on_after(TIMEOUT_S):
            async with self._client.stream(
                "GET", f"/sessions/{sid}/events", headers=headers
            ) as events:
                sent_at = time.monotonic()
                sent = await self._client.post(
                    f"/sessions/{sid}/messages",
                    json={"text": "Note that Acme wants the shipment update by Friday."},
                    headers={**self._headers, "Idempotency-Key": f"bench-m-{uuid.uuid4().hex}"},
                )
                if sent.status_code != 202:
                    self._count(f"http_{sent.status_code}")
                    return False, seen
                first = delta = None
                fields: dict[str, str] = {}
                async for line in events.aiter_lines():
                    if line and not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.strip()
                        continue
                    if "data" not in fields:
                        continue
                    seen = int(fields.get("id", seen))
                    kind = fields.get("event", "")
                    if kind == "SessionOpened":  # a new session's first read replays it
                        fields = {}
                        continue
                    now = time.monotonic()
                    if first is None:
                        first = now
                    if kind == "TextDelta" and delta is None:
                        delta = now
                    if kind == "TurnEnded":
                        status = json.loads(fields["data"]).get("status", "?")
                        self._count(status)
                        ok = status == "succeeded"
                        break
                    fields = {}
                if first is not None:
                    self.first_event_ms.append((first - sent_at) * 1000)
                if delta is not None:
                    self.first_delta_ms.append((delta - sent_at) * 1000)
        if not ok and seen == last:
            self._count("timeout")
        return ok, seen

    def _count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


def _ms(values: list[float]) -> dict[str, Any]:
    return {
        "p50": round(percentile(values, 50), 1),
        "p99": round(percentile(values, 99), 1),
        "count": len(values),
    }


async def session_path(bench: Bench) -> None:
    """32 sessions in a closed loop: turns/s, and the time to the first event and delta."""
    from bench.phases import BenchError, _s

    r, data, stack = bench.report, bench.report.data, bench.stack
    r.section(f"Chat sessions: {SESSIONS} sessions, message -> SSE events -> TurnEnded")
    bench.alive()
    limits = httpx.Limits(max_connections=SESSIONS * 3)
    async with httpx.AsyncClient(
        base_url=stack.api_url, timeout=TIMEOUT_S, limits=limits
    ) as client:
        pool = _Sessions(client, stack.token(TENANT, PRINCIPAL, ttl_s=3600))
        await pool.open(SESSIONS)
        watch = bench.window()
        best = await closed_loop(
            pool.one, concurrency=SESSIONS, warmup_s=_s(3), duration_s=_s(15), watcher=watch
        )
        if best.completed == 0:
            raise BenchError(f"no session turn succeeded: {pool.statuses}")
        data["session_turns_per_s"] = round(best.rate, 1)
        data["session_first_event_ms"] = _ms(pool.first_event_ms)
        data["session_first_delta_ms"] = _ms(pool.first_delta_ms)
        data["session_path"] = {
            **sample_dict(best),
            "statuses": pool.statuses,
            "usage": watch.report(),
        }
        r.sample(f"closed loop, {SESSIONS} sessions", best, "turn/s")
        r.line(
            "first event after a message",
            f"p50 {data['session_first_event_ms']['p50']} "
            f"ms, p99 {data['session_first_event_ms']['p99']} ms",
        )
        r.line(
            "first text delta",
            f"p50 {data['session_first_delta_ms']['p50']} ms, "
            f"p99 {data['session_first_delta_ms']['p99']} ms",
        )
