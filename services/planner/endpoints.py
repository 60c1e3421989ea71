"""The planner's request/reply endpoints (NATS micro, served by `libs.runtime`):
`writ.int.planner.replay` replays a run offline from the journal (`replay/`), and
`writ.int.planner.review` takes a person's answer to a review (`review.py`). Each maps what it
is asked to a reply or an error status: 400 undecodable, 404 no such run or review, 500 a
failure of the planner's own."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.micro.request import Request
from opentelemetry.trace import SpanKind

from libs.journal import PayloadExpired
from libs.runtime import Runtime
from libs.telemetry import extract_context
from schemas.planner import ReplayReport, ReplayRun, ReviewAnswer, ReviewTaken
from services.planner.replay import expired, replay_run
from services.planner.review import ReviewRefused
from services.planner.store import PlannerStore

__all__ = ["ReplayEndpoint", "ReviewEndpoint"]

log = logging.getLogger("writ.planner")


class ReplayEndpoint:
    """`writ.int.planner.replay`: 400 undecodable, 404 no such run of the tenant."""

    def __init__(self, *, rt: Runtime, store: PlannerStore) -> None:
        self._rt, self._store = rt, store
        self._decoder = msgspec.json.Decoder(ReplayRun)
        self._encoder = msgspec.json.Encoder()

    async def replay(self, ask: ReplayRun) -> ReplayReport | None:
        """Replay one run offline from the journal; None if the tenant has no such run."""
        try:
            entries, record, unsealed = await self._store.read_replay(ask.tenant, ask.run_id)
        except PayloadExpired as exc:
            return expired(ask.run_id, exc.key_id)
        if not entries and record is None:
            return None
        return replay_run(ask.run_id, entries, record=record, unsealed=unsealed)

    async def __call__(self, request: Request) -> None:
        """Answer one replay request."""
        started, metrics = time.perf_counter(), self._rt.metrics
        try:
            ask = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            metrics.failed.labels("replay", "undecodable").inc()
            await request.respond_error("400", f"invalid ReplayRun: {exc}")
            return
        try:
            with self._rt.tracer.start_as_current_span(
                "planner replay", context=extract_context(request.headers), kind=SpanKind.SERVER
            ):
                report = await self.replay(ask)
        except Exception as exc:
            metrics.failed.labels("replay", "error").inc()
            log.warning("replay failed: %r", exc)
            await request.respond_error("500", "replay failed")
            return
        if report is None:
            await request.respond_error("404", "no such run")
            return
        await request.respond(self._encoder.encode(report))
        metrics.handled.labels("replay").inc()
        metrics.latency.labels("replay").observe(time.perf_counter() - started)


class ReviewEndpoint:
    """`writ.int.planner.review`: 400 undecodable, 404 no such review waiting."""

    def __init__(self, *, answer: Callable[[ReviewAnswer], Awaitable[ReviewTaken]]) -> None:
        self._answer = answer
        self._decoder = msgspec.json.Decoder(ReviewAnswer)
        self._encoder = msgspec.json.Encoder()

    async def __call__(self, request: Request) -> None:
        """Answer one review answer with where the run stands now."""
        try:
            answer = self._decoder.decode(request.data)
        except msgspec.DecodeError as exc:
            await request.respond_error("400", f"invalid ReviewAnswer: {exc}")
            return
        try:
            result = await self._answer(answer)
        except ReviewRefused as exc:
            await request.respond_error("404", str(exc))
            return
        except Exception as exc:
            log.warning("review answer failed: %r", exc)
            await request.respond_error("500", "review answer failed")
            return
        await request.respond(self._encoder.encode(result))
